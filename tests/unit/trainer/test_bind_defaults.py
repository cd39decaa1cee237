"""Everything that listens on a socket binds loopback unless told otherwise: the
``agentloop-serve`` HTTP front and the MLflow UI that ``agentloop-traces`` starts. The engine
start and the ``mlflow ui`` process are replaced by stand-ins that record what they got."""

from __future__ import annotations

import sys

from servers import ServerConfig
from trainer.cli import serve as serve_cli
from trainer.cli import traces as traces_cli


def test_serve_cli_binds_loopback_with_auth_and_limit_options(monkeypatch, tmp_path):
    served: list[ServerConfig] = []

    async def fake_serve(config):
        served.append(config)

    monkeypatch.setattr(serve_cli, "_serve", fake_serve)
    monkeypatch.delenv("AGENTLOOP_API_KEY", raising=False)
    assert serve_cli.main(["--model", str(tmp_path)]) == 0
    assert (
        serve_cli.main(
            ["--model", str(tmp_path), "--api-key", "k", "--max-concurrent-requests", "8"]
        )
        == 0
    )
    default, custom = served
    assert default.host == "127.0.0.1" and ServerConfig(model="x").host == "127.0.0.1"
    assert default.api_key is None and default.max_concurrent_requests == 256
    assert custom.api_key == "k" and custom.max_concurrent_requests == 8


def test_serve_cli_rejects_a_zero_request_limit(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(serve_cli, "_serve", None)  # never reached
    argv = ["--model", str(tmp_path), "--max-concurrent-requests", "0"]
    assert serve_cli.main(argv) == 2
    assert capsys.readouterr().err == (
        "agentloop-serve: error: max_concurrent_requests must be >= 1, got 0\n"
    )


def test_traces_cli_starts_the_mlflow_ui_on_loopback(monkeypatch, capsys):
    served: list[tuple[str, str, int]] = []
    monkeypatch.setattr(traces_cli, "traces_summary", lambda store, run_dir: ("0", None, 0))
    monkeypatch.setattr(traces_cli, "serve_ui", lambda *args: served.append(args) or 0)
    assert traces_cli.main(["--store", "sqlite:///x.db"]) == 0
    assert served == [("sqlite:///x.db", "127.0.0.1", 5000)]
    command = traces_cli.ui_command(*served[0])
    assert command == [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri"] + [
        "sqlite:///x.db",
        "--host",
        "127.0.0.1",
        "--port",
        "5000",
        "--workers",
        "1",
    ]
    assert "open http://127.0.0.1:5000/#/experiments/0/traces" in capsys.readouterr().out
