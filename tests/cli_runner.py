"""Running the kvlease CLI in-process for the ``test_cli_*_unit`` tests (click's CliRunner)."""

from __future__ import annotations

from click.testing import CliRunner

from ops.cli import kvlease

NO_ENV = {"KVLEASE_CLUSTER": None, "KVLEASE_BOOTSTRAP": None, "KVLEASE_RETRY_TIMEOUT": None,
          "KVLEASE_DEBUG": None, "KVLEASE_CLIENT_RETRY_TOTAL_TIMEOUT": None,
          "KVLEASE_CA_FILE": None, "KVLEASE_CERT_FILE": None, "KVLEASE_KEY_FILE": None,
          "KVLEASE_SECURITY_USERNAME": None, "KVLEASE_SECURITY_PASSWORD": None, "KVLEASE_PASSWORD_FILE": None,
          "KVLEASE_NEW_USER_PASSWORD": None}


def run(*args: str, env: dict | None = None):
    return CliRunner().invoke(kvlease, list(args), env={**NO_ENV, **(env or {})}, prog_name="kvlease")


def assert_one_line_error(result, code: int = 1) -> str:
    assert result.exit_code == code, (result.exit_code, result.output)
    assert isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert result.stdout == ""
    return lines[0]
