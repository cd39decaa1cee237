"""The studio's pages (Jinja2, rendered on the server; plain forms, no JavaScript build)."""

from __future__ import annotations

BASE = """<!doctype html>
<html><head><meta charset="utf-8">
{% if refresh %}<meta http-equiv="refresh" content="{{ refresh }}">{% endif %}
<title>agentloop studio - {{ title }}</title>
<style>
body { font-family: sans-serif; margin: 1.5em; max-width: 70em; }
nav a { margin-right: 1em; } pre { background: #f4f4f4; padding: .5em; white-space: pre-wrap; }
.error { color: #a00; } .ok { color: #070; } table { border-collapse: collapse; }
td, th { border: 1px solid #ccc; padding: .3em .6em; vertical-align: top; text-align: left; }
input[type=text], textarea { width: 40em; }
#tools input[type=text] { width: 16em; } #tools pre { white-space: pre; }
.span { white-space: pre-wrap; font-family: monospace; padding: .1em .2em; margin: .1em 0; }
.trained { background: #e3f4e3; border-left: 4px solid #2a2; }
.observed { background: #eee; border-left: 4px solid #999; }
.sample { border: 1px solid #ccc; padding: .5em; margin: .8em 0; }
</style></head><body>
<nav><a href="/">studio</a><a href="/tools">tools</a><a href="/reward">reward</a>
<a href="/preview">preview</a><a href="/train">train</a></nav>
<h1>{{ title }}</h1>
{% if error %}<pre class="error" id="error">{{ error }}</pre>{% endif %}
{% block body %}{% endblock %}
</body></html>"""

INDEX = """{% extends "base" %}{% block body %}
<p>Build a tool environment: load its tools and call them as the model would, try a reward
file on an answer. The same loaders and checks as <code>agentloop-train</code>: an error here
is the error the run would give.</p>
<ul><li><a href="/tools">tools</a>{% if tools %}: {{ tools.path }} ({{ tools.tools|length }}
loaded){% endif %}</li>
<li><a href="/reward">reward</a>{% if reward %}: {{ reward.path }}:{{ reward.name }}{% endif %}
</li><li><a href="/preview">preview</a>: a few rows through the real servers and agent loops,
turn by turn, with rewards and advantages</li>
<li><a href="/train">train</a>: start a run and follow it</li></ul>
{% endblock %}"""

TOOLS = """{% extends "base" %}{% block body %}
<form method="post" action="/tools/load">
<label>tool config (YAML, MCP JSON or a .py module of functions)
<input type="text" name="path" id="tool-path" value="{{ bench.path if bench else '' }}"></label>
<button type="submit" id="load-tools">load</button></form>
{% if bench %}
<h2>{{ views|length }} tool(s) from {{ bench.path }}</h2>
<table id="tools"><tr><th>tool</th><th>source</th><th>arguments (JSON schema)</th>
<th>call</th></tr>
{% for view in views %}<tr id="tool-{{ view.name }}"><td><b>{{ view.name }}</b><br>
{{ view.description }}</td><td>{{ view.source }}</td>
<td><pre>{{ view.parameters | tojson(indent=2) }}</pre></td>
<td><form method="post" action="/tools/call">
<input type="hidden" name="name" value="{{ view.name }}">
{% for arg, spec in (view.parameters.get('properties') or {}).items() %}
<label>{{ arg }} ({{ spec.get('type', 'any') }})
<input type="text" name="arg:{{ arg }}" id="arg-{{ view.name }}-{{ arg }}"></label><br>
{% endfor %}
<button type="submit" id="call-{{ view.name }}">call</button></form></td></tr>
{% endfor %}</table>
<form method="post" action="/tools/close"><button type="submit">stop its servers</button></form>
{% endif %}
{% if call %}<h2>what the model reads from {{ call.name }}</h2>
<p class="{{ 'ok' if call.ok else 'error' }}" id="call-status">
{{ 'ok' if call.ok else call.error_kind }} in {{ '%.3f' % call.seconds }} s
{% if call.truncated %}(truncated as in training){% endif %}</p>
<p>arguments: <code>{{ call.arguments | tojson }}</code></p>
<pre id="call-text">{{ call.text }}</pre>{% endif %}
{% endblock %}"""

REWARD = """{% extends "base" %}{% block body %}
<form method="post" action="/reward/load">
<label>reward file <input type="text" name="path" id="reward-path"
value="{{ bench.path if bench else '' }}"></label>
<label>function <input type="text" name="name" value="{{ bench.name if bench else
'compute_score' }}"></label>
<button type="submit" id="load-reward">load</button></form>
{% if bench %}<form method="post" action="/reward/score">
<label>row (JSON: data_source, reward_model.ground_truth, extra_info)<br>
<textarea name="row" id="reward-row" rows="5">{{ row }}</textarea></label><br>
<label>answer<br><textarea name="answer" id="reward-answer" rows="4">{{ answer }}</textarea>
</label><br><button type="submit" id="score">score</button></form>{% endif %}
{% if view %}<h2>result</h2>
{% if view.error %}<pre class="error" id="reward-error">{{ view.error }}</pre>
{% else %}<p id="reward-score">score: {{ view.score }}</p>
<pre id="reward-result">{{ view.result | tojson(indent=2) }}</pre>{% endif %}{% endif %}
{% endblock %}"""

TRAIN = """{% extends "base" %}{% block body %}
<details id="settings"{% if not job %} open{% endif %}><summary>settings</summary>
<form method="post" action="/train/start" id="train-settings"><table id="train-form">
{% for key, label, default in fields %}<tr><td>{{ label }}<br><code>{{ key }}</code></td>
<td><input type="text" name="{{ key }}" id="field-{{ key }}"
value="{{ settings.get(key, default) }}"></td></tr>{% endfor %}</table>
</form></details>
<button type="submit" form="train-settings" formaction="/train/check" id="check">check</button>
<button type="submit" form="train-settings" id="start">start</button>
{% if checked %}<p id="checked">The settings pass agentloop-train's checks. Config file
<code>{{ checked.file }}</code>; the same run from a shell:</p>
<pre id="command">{{ checked.command }}</pre>{% endif %}
{% if job %}<h2>run: {{ job.run_dir }}</h2>
<p id="run-state">{% if job.running %}running{% if job.stop_requested %}, stopping after its
step{% endif %}{% else %}ended (exit {{ job.returncode }}){% endif %}</p>
<pre id="command">{{ job.command_line }}</pre>
{{ curve | safe }}
<table id="steps"><tr><th>step</th><th>reward/mean</th><th>step s</th><th>gen s</th>
<th>update s</th><th>tool calls/sample</th></tr>
{% for p in points %}<tr class="step-row"><td>{{ p.step }}</td>
<td>{{ '%.4f' % p.reward if p.reward is not none else '' }}</td>
<td>{{ '%.1f' % p.seconds if p.seconds is not none else '' }}</td>
<td>{{ '%.1f' % p.metrics.get('timing_s/gen', 0) }}</td>
<td>{{ '%.1f' % p.metrics.get('timing_s/update_actor', 0) }}</td>
<td>{{ '%.2f' % p.metrics.get('agent_loop/tool_calls/mean', 0) }}</td></tr>{% endfor %}</table>
<p>checkpoints: <span id="checkpoints">{{ job.checkpoints() | join(', ') }}</span></p>
<p>rollout traces: <code>{{ traces }}</code></p>
{% if job.running %}<form method="post" action="/train/stop">
<button type="submit" id="stop">stop (after this step, with a checkpoint)</button></form>
{% endif %}<h3>log</h3><pre id="log">{{ job.log_tail() }}</pre>{% endif %}
{% endblock %}"""

PREVIEW = """{% extends "base" %}{% block body %}
<details id="settings"{% if not job %} open{% endif %}><summary>settings</summary>
<form method="post" action="/preview/start" id="preview-settings"><table id="preview-form">
{% for key, label, default in fields %}<tr><td>{{ label }}<br><code>{{ key }}</code></td>
<td><input type="text" name="{{ key }}" id="field-{{ key }}"
value="{{ settings.get(key, default) }}"></td></tr>{% endfor %}
<tr><td>estimator (for the group advantages)<br><code>algorithm.adv_estimator</code></td>
<td><input type="text" name="algorithm.adv_estimator" id="field-algorithm.adv_estimator"
value="{{ settings.get('algorithm.adv_estimator', 'grpo') }}"></td></tr>
<tr><td>rows, typed (JSON lines; used instead of the rows file)</td>
<td><textarea name="rows" id="preview-rows" rows="5">{{ settings.get('rows', '') }}</textarea>
</td></tr>
<tr><td>more overrides (<code>key=value</code> per line, as on the command line)</td>
<td><textarea name="overrides" id="preview-overrides" rows="2">{{ settings.get('overrides', '')
}}</textarea></td></tr></table></form></details>
<button type="submit" form="preview-settings" id="preview">preview</button>
{% if job %}<h2>{{ job.output.parent.name }}</h2>
{% for note in job.notes %}<p class="error note">{{ note }}</p>{% endfor %}
<p id="preview-state">{% if job.running %}running: {% if progress %}{{ progress[0] }} of
{{ progress[1] }} trajectories{% else %}starting the servers and agent loops{% endif %}
{% elif job.cancelled %}cancelled (exit {{ job.returncode }})
{% elif job.returncode == 0 %}done: {{ views|length }} samples
{% else %}failed (exit {{ job.returncode }}){% endif %}</p>
{% if job.running %}<form method="post" action="/preview/cancel">
<button type="submit" id="cancel">cancel</button></form>{% endif %}
<p>the same run from a shell (its config: these overrides on <code>ppo_trainer</code>):</p>
<pre id="preview-command">{{ job.command }}</pre>
{% if views %}<p>legend: <span class="span trained">trained tokens (loss mask 1)</span>
<span class="span observed">tool / user reply (loss mask 0)</span>. Advantages:
<code>{{ job.estimator }}</code> over each row's samples{% if advantage_note %}
({{ advantage_note }}){% endif %}.</p>
<table id="preview-summary"><tr><th>row</th><th>sample</th><th>reward</th><th>advantage</th>
<th>model turns</th><th>tool calls (errors)</th><th>tokens: prompt / response / trained</th>
<th>stop</th></tr>
{% for v in views %}<tr class="preview-row"><td>{{ v.index }}</td><td>{{ v.rollout_n }}</td>
<td class="reward">{{ 'unscored' if v.score is none else '%.4g' % v.score }}</td>
<td class="advantage">{{ '' if v.advantage is none else '%+.4f' % v.advantage }}</td>
<td>{{ v.spans | selectattr('trained') | list | length }}</td>
<td>{{ v.tool_calls }} ({{ v.tool_errors }})</td>
<td>{{ v.prompt_tokens }} / {{ v.response_tokens }} / {{ v.trained_tokens }}</td>
<td>{{ v.stop_reason }}</td></tr>{% endfor %}</table>
{% for v in views %}<div class="sample" id="sample-{{ loop.index0 }}">
<b>row {{ v.index }}, sample {{ v.rollout_n }}</b> ({{ v.agent_name }}, data_source
{{ v.data_source }}): reward {{ 'unscored' if v.score is none else '%.4g' % v.score }}
{% if v.scores %}<code>{{ v.scores | tojson }}</code>{% endif %}
<details><summary>prompt ({{ v.prompt_tokens }} tokens)</summary>
<pre>{{ v.prompt_text }}</pre></details>
{% for span in v.spans %}<small>{{ 'model turn' if span.trained else 'reply' }},
{{ span.tokens }} tokens</small><div class="span {{ 'trained' if span.trained else 'observed' }}"
title="{{ span.tokens }} tokens">{{ span.text }}</div>
{% for call in span.calls %}<p class="call">tool call: <code>{{ call.name }}({{
call.arguments | tojson }})</code> {{ 'ok' if call.ok else 'failed' }} in
{{ '%.3f' % call.seconds }} s</p>{% endfor %}
{% endfor %}</div>{% endfor %}{% endif %}
<h3>log</h3><pre id="log">{{ job.log_tail() }}</pre>{% endif %}
{% endblock %}"""

PAGES = {
    "base": BASE,
    "index": INDEX,
    "tools": TOOLS,
    "reward": REWARD,
    "preview": PREVIEW,
    "train": TRAIN,
}
