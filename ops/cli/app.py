"""The ``kvlease`` root group, the state the commands share, and ``main``.

One click group, :func:`kvlease`, keeps the global options in a :class:`State`
that builds the admin client (lazily: only commands that talk to a coordinator
pay for it) and the :class:`kvlease.ops.cli.output.Output` (text or ``--json``) once.
:func:`catch_errors` turns every kvlease error into one line on stderr and exit
code 1; usage errors (bad option syntax) are click's and exit 2.

Finding the cluster, first match wins: ``--bootstrap``, then ``--cluster``
given on the command line (before or after the command name), then
``KVLEASE_BOOTSTRAP``, then ``KVLEASE_CLUSTER``.

Who the CLI authenticates as (security on), first match wins: ``--user`` (its
password from ``--password-file``, else ``KVLEASE_SECURITY_PASSWORD``, else a
prompt when stdin is a terminal); ``KVLEASE_SECURITY_USERNAME`` and
``KVLEASE_SECURITY_PASSWORD``; the credentials a ``--cluster`` directory names
(``cluster start --secure``: the super user ``admin``); else the mutual-TLS
client certificate, if any. A password is never taken from the command line
and never sent without TLS.

An unknown outcome (a request sent and not answered, which may have been applied) is
``error: outcome unknown: …``. An unreachable server and a coordinator that cannot reach
ZooKeeper are retried until ``--retry-timeout`` runs out, and the message says so; only the
first asks ``is the cluster running?`` (the coordinator answered: ZooKeeper is the problem). A
``--cluster`` directory none of whose recorded processes runs is said at once (``the cluster in D is
not running …``), nothing tried.

The commands are in the sibling modules, one per command group; they add
themselves to :func:`kvlease` when imported, which the root group does for the
command being run only (:data:`COMMAND_MODULES`; all of them for the root's
``--help``).
"""

from __future__ import annotations

import functools
import getpass
import importlib
import os
import sys
import traceback
from typing import Callable

import click
from click.core import ParameterSource

from kvlease.common import arrow_pandas
from kvlease.common import config as cfg
from kvlease.common import errors
from kvlease.common.errors import single_line
from kvlease.ops import local_cluster
import kvlease.ops.cli.output as out
from kvlease.ops.cli.interrupts import interrupted
from kvlease.ops.cli.values import DURATION

DEFAULT_RETRY_TIMEOUT = "10s"


# -- state shared by the commands ------------------------------------------------------------------


class State:
    """The global options; builds the admin client and the output once, on first use."""

    def __init__(self, cluster: str | None = None, bootstrap: str | None = None, json_mode: bool = False,
                 retry_timeout_ms: int | None = None, debug: bool = False,
                 tls_files: dict[str, str | None] | None = None, user: str | None = None,
                 password_file: str | None = None) -> None:
        self.cluster = cluster
        self.bootstrap = bootstrap
        self.cluster_cmdline = False  # given on the command line (not through the environment)
        self.bootstrap_cmdline = False
        self.json_mode = json_mode
        self.retry_timeout_ms = retry_timeout_ms
        self.debug = debug
        self.tls_files = {k: v for k, v in (tls_files or {}).items() if v}  # --ca-file etc. as config keys
        self.user = user  # --user
        self.password_file = password_file  # --password-file
        self._password: str | None = None  # asked at most once
        self._client = None
        self._table_clients: list = []
        self._output: out.Output | None = None

    @property
    def output(self) -> out.Output:
        if self._output is None:
            self._output = out.make_output(self.json_mode)
        return self._output

    def _uses_bootstrap(self) -> bool:
        return bool(self.bootstrap and (self.bootstrap_cmdline or not self.cluster_cmdline))

    def addresses(self) -> list[str]:
        if self._uses_bootstrap():
            from kvlease.client.admin import parse_bootstrap

            return parse_bootstrap(self.bootstrap)
        if self.cluster:
            from kvlease.client.cluster_dir import check_running

            check_running(self.cluster, local_cluster.load(self.cluster))  # a stopped cluster: said at once
            return local_cluster.bootstrap(self.cluster)
        raise errors.InvalidRequestError(
            "no cluster given: use --cluster DIR or --bootstrap HOST:PORT[,…] "
            "(or set KVLEASE_CLUSTER / KVLEASE_BOOTSTRAP)")

    def config(self) -> cfg.Config:
        """The client config: the environment, then a cluster directory's security settings (``--cluster``;
        its credentials only if neither ``--user`` nor ``KVLEASE_SECURITY_USERNAME`` names a user), then
        ``--ca-file``/``--cert-file``/``--key-file`` (which turn TLS on), then ``--user``/``--password-file``."""
        from kvlease.client.connect import layered_config  # shared with kvlease.connect()

        settings = None
        if self.cluster and not self._uses_bootstrap():
            settings = local_cluster.security_settings(local_cluster.load(self.cluster))
        config = layered_config(os.environ, settings, self.tls_files, user_named=bool(self.user))
        if self.user or self.password_file:
            config = config.with_overrides(self._credentials(config))
        return config

    def _credentials(self, config: cfg.Config) -> dict[str, str]:
        """``--user`` and its password as config keys (see the module doc)."""
        if not config[cfg.SECURITY_ENABLED]:  # checked before anything is sent: a usage error (exit 2)
            raise click.UsageError(
                "--user/--password-file need TLS (--ca-file, or --cluster of a secure cluster): "
                "a password is never sent in the clear")
        user = self.user or config[cfg.SECURITY_USERNAME]
        if not user:
            raise errors.InvalidRequestError("--password-file needs --user NAME (or KVLEASE_SECURITY_USERNAME)")
        if self._password is None:
            if self.password_file:
                from kvlease.client.cluster_dir import read_password_file

                self._password = read_password_file(self.password_file)
            elif os.environ.get(cfg.SECURITY_PASSWORD.env_var):
                self._password = os.environ[cfg.SECURITY_PASSWORD.env_var]
            elif sys.stdin is not None and sys.stdin.isatty():
                self._password = getpass.getpass(f"password of {user}: ")
            else:
                raise errors.InvalidRequestError(
                    f"no password for --user {user}: use --password-file FILE or {cfg.SECURITY_PASSWORD.env_var}, "
                    "or run interactively to be asked")
        return {cfg.SECURITY_USERNAME.name: user, cfg.SECURITY_PASSWORD.name: self._password}

    def retry_ms(self, config: cfg.Config) -> int:
        if self.retry_timeout_ms is not None:
            return self.retry_timeout_ms
        if cfg.CLIENT_RETRY_TOTAL.env_var in os.environ:
            return config[cfg.CLIENT_RETRY_TOTAL]
        return cfg.parse_duration_ms(DEFAULT_RETRY_TIMEOUT)

    @property
    def client(self):
        if self._client is None:
            addresses = self.addresses()  # first: a stopped cluster is said before the client's imports
            from kvlease.client.admin import AdminClient

            config = self.config()
            self._client = AdminClient(addresses, config, retry_total_s=self.retry_ms(config) / 1000.0)
        return self._client

    def table_client(self, path: str, partition=None):
        """A :class:`kvlease.client.table.TableClient` on ``path`` (``partition``: its view of one partition, a
        :class:`kvlease.common.tables.TableInfo`), retrying as long as the admin client."""
        from kvlease.client.table import TableClient

        config = self.config()
        client = TableClient(self.client, path, config, retry_total_s=self.retry_ms(config) / 1000.0,
                             partition=partition)
        self._table_clients.append(client)
        return client

    def close(self) -> None:
        for table_client in self._table_clients:
            table_client.close()
        if self._client is not None:
            self._client.close()


def _message(exc: BaseException, state: State | None) -> str:
    if isinstance(exc, errors.OutcomeUnknownError):  # sent, no answer: it may have been applied
        return f"outcome unknown: {exc.message}"
    if isinstance(exc, (errors.NetworkError, errors.ZooKeeperUnavailableError)):  # retried until --retry-timeout
        retry = state.retry_timeout_ms if state and state.retry_timeout_ms is not None else None
        waited = f"{retry / 1000:g}s" if retry is not None else DEFAULT_RETRY_TIMEOUT
        unreachable = "; is the cluster running?" if isinstance(exc, errors.NetworkError) else ""
        return f"{exc.message} (gave up after retrying for {waited}{unreachable})"
    if isinstance(exc, errors.KvLeaseError):
        return exc.message
    return f"internal error: {type(exc).__name__}: {exc} (set KVLEASE_DEBUG=1 for a traceback)"


def catch_errors(func: Callable) -> Callable:
    """kvlease errors -> ``error: <message>`` on stderr and exit 1; never a traceback for them."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        ctx = click.get_current_context()
        state = ctx.find_object(State)
        try:
            return func(*args, **kwargs)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except KeyboardInterrupt:
            interrupted(ctx)
        except Exception as exc:
            if state is not None and state.debug:
                traceback.print_exc()
            click.echo(f"error: {single_line(_message(exc, state))}", err=True)
            ctx.exit(1)

    return wrapper


def checked_bootstrap(ctx: click.Context, param, value: str | None) -> str | None:
    """``--bootstrap`` (or KVLEASE_BOOTSTRAP): a malformed address is a usage error, not 10 s of retries."""
    from kvlease.client.admin import parse_bootstrap

    if value is not None:
        try:
            parse_bootstrap(value)
        except errors.InvalidRequestError as exc:
            raise click.BadParameter(exc.message, ctx, param) from None
    return value


def common_options(func: Callable) -> Callable:
    """``--json``, ``--cluster`` and ``--bootstrap`` on a command too, e.g. ``kvlease lease list --json``."""
    return _command_options(func, bootstrap=True)


def cluster_dir_options(func: Callable) -> Callable:
    """``--json`` and ``--cluster`` on a command that works on a local cluster's directory (its processes),
    where coordinator addresses alone cannot do: ``cluster start|stop|status``, ``drill``."""
    return _command_options(func, bootstrap=False)


def _command_options(func: Callable, *, bootstrap: bool) -> Callable:
    def setter(attr: str, flag: str | None = None, check: Callable | None = None):
        def callback(ctx: click.Context, param, value) -> None:
            if check is not None:
                check(ctx, param, value)
            if value:
                state = ctx.ensure_object(State)
                setattr(state, attr, value)
                if flag:
                    setattr(state, flag, True)
        return callback

    func = click.option("--json", "json_flag", is_flag=True, expose_value=False, callback=setter("json_mode"),
                        help="Print exactly one JSON document on stdout.")(func)
    if bootstrap:
        func = click.option("--bootstrap", "bootstrap_opt", expose_value=False, metavar="HOST:PORT[,…]",
                            callback=setter("bootstrap", "bootstrap_cmdline", checked_bootstrap),
                            help="Coordinator addresses.")(func)
    func = click.option("--cluster", "cluster_opt", expose_value=False, metavar="DIR",
                        callback=setter("cluster", "cluster_cmdline"), help="A local cluster directory.")(func)
    return func


# -- the group -----------------------------------------------------------------------------------


class OneLineUsageError(click.UsageError):
    """Bad input shown as one line, ``error: … (see: kvlease CMD --help)`` (exit code 2)."""

    def show(self, file=None) -> None:
        hint = f" (see: {self.ctx.command_path} --help)" if self.ctx is not None else ""
        click.echo(f"error: {single_line(self.format_message())}{hint}", err=True)


def _one_line(exc: click.UsageError) -> click.UsageError:
    """Any usage error as a :class:`OneLineUsageError`; a group called without a command keeps its help."""
    if isinstance(exc, (OneLineUsageError, click.exceptions.NoArgsIsHelpError)):
        return exc
    return OneLineUsageError(exc.format_message(), exc.ctx)


#: The modules of ``ops.cli`` that add each top-level command (a group's subcommands may come from several).
COMMAND_MODULES = {
    "acl": ("security",), "bench": ("plugins",), "bucket": ("bucket", "bucket_loss", "bucket_moves"),
    "cluster": ("cluster", "cluster_moves"), "delete": ("data",), "demo": ("demo",), "drill": ("plugins",),
    "get": ("data",), "lease": ("lease",), "log": ("changelog",), "partition": ("partition",), "put": ("data",),
    "scan": ("scan",), "snapshot": ("snapshot",), "table": ("table",), "user": ("security",),
}
#: The commands that may run Spark in this process (and so hand pandas objects to pyarrow): every other one
#: tells pyarrow pandas is absent and never imports it (common/arrow_pandas.py).
WITH_PANDAS = frozenset({"bench", "demo", "drill"})


class KvleaseGroup(click.Group):
    """The root group: an argument that is not valid text is a usage error before anything runs, and
    every usage error of any command (bad option syntax, a failed check of a value, an unknown command)
    is one ``error:`` line, like every other error (click's own is four lines with the usage). A command's
    modules are imported when it is looked up (:data:`COMMAND_MODULES`); Ctrl-C meanwhile is
    ``error: interrupted``, exit code 130, as in a command."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(COMMAND_MODULES))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in WITH_PANDAS:
            arrow_pandas.without_pandas()
        for module in COMMAND_MODULES.get(name, ()):
            importlib.import_module(f"kvlease.ops.cli.{module}")
        return super().get_command(ctx, name)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        for arg in args:
            try:
                arg.encode("utf-8")
            except UnicodeEncodeError:  # bytes that are not UTF-8 arrive as lone surrogates
                raise OneLineUsageError(f"argument {ascii(arg)} is not valid UTF-8", ctx) from None
        return super().parse_args(ctx, args)

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.UsageError as exc:
            raise _one_line(exc) from None
        except KeyboardInterrupt:  # while the global options are read (click's own: "Aborted!", exit 1)
            interrupted(None)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)  # parses and runs the subcommands
        except click.UsageError as exc:
            raise _one_line(exc) from None
        except KeyboardInterrupt:  # before the command's own handling (catch_errors): importing it
            interrupted(ctx)


@click.group(cls=KvleaseGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--cluster", "cluster_dir", envvar="KVLEASE_CLUSTER", metavar="DIR",
              help="A local cluster directory (made by `kvlease cluster start`). Env: KVLEASE_CLUSTER.")
@click.option("--bootstrap", envvar="KVLEASE_BOOTSTRAP", metavar="HOST:PORT[,…]", callback=checked_bootstrap,
              help="Coordinator addresses. Env: KVLEASE_BOOTSTRAP.")
@click.option("--json", "json_mode", is_flag=True, help="Print exactly one JSON document on stdout.")
@click.option("--retry-timeout", type=DURATION, envvar="KVLEASE_RETRY_TIMEOUT", metavar="DURATION",
              help=f"How long to retry an unreachable cluster (default {DEFAULT_RETRY_TIMEOUT}). "
                   "Env: KVLEASE_RETRY_TIMEOUT.")
@click.option("--debug", is_flag=True, envvar="KVLEASE_DEBUG", help="Show tracebacks of unexpected errors.")
@click.option("--ca-file", envvar="KVLEASE_CA_FILE", metavar="PEM",
              help="Connect with TLS, verifying the servers against this CA (security.tls.ca-file). "
                   "Env: KVLEASE_CA_FILE.")
@click.option("--cert-file", envvar="KVLEASE_CERT_FILE", metavar="PEM",
              help="Client certificate for mutual TLS (security.tls.cert-file). Env: KVLEASE_CERT_FILE.")
@click.option("--key-file", envvar="KVLEASE_KEY_FILE", metavar="PEM",
              help="Key of --cert-file (security.tls.key-file). Env: KVLEASE_KEY_FILE.")
@click.option("--user", metavar="NAME",
              help="Authenticate as this user (security.username); its password from --password-file, "
                   "KVLEASE_SECURITY_PASSWORD, or a prompt. Env: KVLEASE_SECURITY_USERNAME.")
@click.option("--password-file", envvar="KVLEASE_PASSWORD_FILE", metavar="FILE",
              help="Read the password of --user from the first line of FILE (keep it 0600). "
                   "Env: KVLEASE_PASSWORD_FILE.")
@click.pass_context
def kvlease(ctx: click.Context, cluster_dir: str | None, bootstrap: str | None, json_mode: bool,
            retry_timeout: int | None, debug: bool, ca_file: str | None, cert_file: str | None,
            key_file: str | None, user: str | None, password_file: str | None) -> None:
    """kvlease: tables, KV snapshots and snapshot leases on a kvlease cluster."""
    tls_files = {cfg.TLS_CA_FILE.name: ca_file, cfg.TLS_CERT_FILE.name: cert_file, cfg.TLS_KEY_FILE.name: key_file}
    state = State(cluster_dir, bootstrap, json_mode, retry_timeout, debug, tls_files, user, password_file)
    state.cluster_cmdline = ctx.get_parameter_source("cluster_dir") == ParameterSource.COMMANDLINE
    state.bootstrap_cmdline = ctx.get_parameter_source("bootstrap") == ParameterSource.COMMANDLINE
    ctx.obj = state
    ctx.call_on_close(state.close)


pass_state = click.make_pass_decorator(State)
