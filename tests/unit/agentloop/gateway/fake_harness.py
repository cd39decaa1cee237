"""A stand-in for a coding CLI (tests only): what it does is chosen by ``FAKE_MODE`` in the
task's workspace file ``mode.txt``.

``solve``: record its argv and environment in ``$HOME/seen.json``, write a session log under
``$HOME/.claude/projects/``, make one model call on its dialect's route, write ``solved.txt``
in the workspace, exit 0. ``hang``: start a grandchild ``sleep`` marked by the workspace's
``token.txt`` and sleep. ``crash``: print to stderr and exit 3.
"""

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

mode = Path("mode.txt").read_text().strip()
home = Path(os.environ["HOME"])
if mode == "crash":
    print("fake harness: boom", file=sys.stderr)
    sys.exit(3)
if mode == "hang":
    token = Path("token.txt").read_text().strip()
    subprocess.Popen(["sleep", token])  # a grandchild the kill must take too
    time.sleep(600)
seen = {"argv": sys.argv[1:], "env": dict(os.environ), "cwd": os.getcwd()}
(home / "seen.json").write_text(json.dumps(seen))
(home / ".claude" / "projects").mkdir(parents=True, exist_ok=True)
(home / ".claude" / "projects" / "session.jsonl").write_text('{"type": "fake"}\n')
if "ANTHROPIC_BASE_URL" in os.environ:
    url = os.environ["ANTHROPIC_BASE_URL"] + "/v1/messages"
    body = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "fix it"}]}
    headers = {"x-api-key": os.environ["ANTHROPIC_API_KEY"]}
else:
    url = os.environ["OPENAI_BASE_URL"] + "/responses"
    body = {"model": "m", "input": "fix it"}
    headers = {"authorization": "Bearer " + os.environ["AGENTLOOP_API_KEY"]}
headers["content-type"] = "application/json"
request = urllib.request.Request(url, json.dumps(body).encode(), headers, method="POST")
reply = json.loads(urllib.request.urlopen(request, timeout=120).read())
print(json.dumps(reply))
Path("solved.txt").write_text("yes\n")
