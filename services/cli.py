"""The ``tasmoe`` command. Platform subcommands live here; each service adds its own through ``services.<name>.cli``.

A service's ``cli.py`` defines ``register(sub: argparse._SubParsersAction) -> None`` and sets ``func`` on its parsers
(``func(args) -> int``). User errors (`TasmoeError`) print one line and exit 2; nothing prints a stack trace for them.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from services import optional_module
from services.commands import COMMANDS
from shared import DEFAULT_PORTS, SERVICES
from shared.errors import BadInput, NotFound, TasmoeError
from shared.logging import setup_logging

if TYPE_CHECKING:  # httpx only for the commands that call services
    from shared.client import ServiceClients

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one readable line, exit 2
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def port_number(text: str) -> int:
    """A TCP port for ``--port`` (argparse's type: a bad one is a usage error, exit 2, one line)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 1 to 65535, got {port}")
    return port


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from services.root_app import build_app
    from shared.auth import KeyStore, check_bind
    from shared.settings import get_settings

    settings = get_settings()
    check_bind(args.host, settings.auth)
    if settings.auth == "keys":
        store = KeyStore(settings.effective_keys_file())
        key = None
        try:
            if settings.service_key:  # the deployment's secret: the key the services present to each other
                store.ensure(settings.service_key, "service", "admin")
            key = store.first_admin_key()
        except OSError as exc:  # a read-only key file (a Kubernetes Secret): it is the deployment's to fill
            print(f"tasmoe serve: key file {store.path} not writable ({exc.strerror}); using it as it is",
                  file=sys.stderr)
        if key is not None:  # zero set-up, but explicit: printed once
            print(f"tasmoe serve: TASMOE_AUTH=keys and no key in {store.path}: created an admin key (shown once):\n"
                  f"  {key}\nsend it as 'Authorization: Bearer <key>'; more keys: tasmoe keys create --scope "
                  "read|submit|admin --principal NAME", file=sys.stderr, flush=True)
    port = args.port if args.port is not None else DEFAULT_PORTS.get(args.service, 8000)
    uvicorn.run(build_app(args.service, settings), host=args.host, port=port, log_level=settings.log_level.lower())
    return 0


def _keys(args: argparse.Namespace) -> int:
    from shared.auth import KeyStore, new_key
    from shared.settings import get_settings

    if args.action == "new":  # a key for a deployment's secret (TASMOE_SERVICE_KEY), stored nowhere
        print(new_key())
        return 0
    store = KeyStore(Path(args.file) if args.file else get_settings().effective_keys_file())
    if args.action == "create":
        key = store.create(args.principal, args.scope)
        print(key)
        print(f"tasmoe keys: {args.scope} key for {args.principal} stored (hashed) in {store.path}; it is shown "
              "only now", file=sys.stderr)
    elif args.action == "revoke":
        if not args.id:
            raise BadInput("keys revoke needs the key's id (tasmoe keys list)", field="id")
        store.revoke(args.id)
        print(f"revoked {args.id}")
    else:
        for k in store.records():
            state = f"revoked {k['revoked']}" if k.get("revoked") else "active"
            print(f"{k['id']}  {k['scope']:<6}  {k['principal']:<20}  created {k.get('created', '?')}  {state}")
    return 0


_CONFIG_KINDS = ("arch", "tas", "workload")


def _config_check(args: argparse.Namespace) -> int:
    from shared.configs import ArchConfig, TasParams, WorkloadConfig, load_config
    from shared.configs.base import StrictModel
    from shared.configs.loader import inline_model_file
    from shared.settings import load_settings

    kinds: dict[str, type[StrictModel]] = {"arch": ArchConfig, "workload": WorkloadConfig, "tas": TasParams}
    model = kinds[args.kind]
    cfg: StrictModel = load_config(args.file, model)
    zoo = optional_module("workload", "zoo")
    if isinstance(cfg, WorkloadConfig) and zoo is not None:
        # the model must exist (shipped with the workload service, or registered in the models folder of this
        # environment's settings; `tasmoe run` and POST /v1/experiments ask the workload service itself)
        try:
            zoo.ModelZoo.from_settings(load_settings()).resolve_model(
                inline_model_file(cfg, Path(args.file).parent).model)
        except NotFound as exc:
            raise BadInput(f"{args.file}: model: {exc.message}", field="model") from None
    if args.json:
        print(json.dumps(cfg.model_dump(mode="json"), indent=2, sort_keys=True))
    else:
        print(f"{args.file}: ok ({args.kind}, hash {cfg.content_hash()})")
    return 0


def _openapi(args: argparse.Namespace) -> int:
    from services.root_app import write_openapi
    from shared.settings import get_settings

    for path in write_openapi(Path(args.out), get_settings()):
        print(path)
    return 0


def _command_of(argv: Sequence[str]) -> str | None:
    """The subcommand named in ``argv`` (skipping the global options), or None."""
    skip = False
    for tok in argv:
        if skip:
            skip = False
        elif tok == "--log-level":
            skip = True
        elif not tok.startswith("-"):
            return tok
    return None


ALL_COMMANDS = "*"


def _not_loaded(args: argparse.Namespace) -> int:  # pragma: no cover - main() loads the command it parses
    raise BadInput(f"the command {args.command!r} was not loaded")


def build_parser(only: str | None = ALL_COMMANDS) -> argparse.ArgumentParser:
    """The parser of every command (default). With ``only`` (a command name, or None for none), only the service
    that owns that command is imported and registered (``services.commands.COMMANDS``); every other service command
    is a stub that carries its help line, so ``tasmoe --help`` lists them all without importing a service."""
    parser = _Parser(prog="tasmoe", description="TAS-MoE Lab: thermal-aware MoE scheduling on a 3D-stacked chip.")
    parser.add_argument("--log-level", default=None, type=str.upper,
                        choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
                        help="override TASMOE_LOG_LEVEL (DEBUG, INFO, WARNING, ERROR, CRITICAL)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    p = sub.add_parser("serve", help="run one service (or 'all' mounted on one port) under uvicorn")
    p.add_argument("service", choices=[*SERVICES, "all"], help="the service to run, or all six on one port")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    p.add_argument("--port", type=port_number, default=None, help="default: the service's port (8000-8005)")
    p.set_defaults(func=_serve)

    p = sub.add_parser("config", help="validate a config file and print its content hash")
    p.add_argument("kind", choices=_CONFIG_KINDS, help="which config model the file holds")
    p.add_argument("file", help="the YAML or JSON config file")
    p.add_argument("--json", action="store_true", help="print the config with defaults filled in")
    p.set_defaults(func=_config_check)

    p = sub.add_parser("keys", help="API keys (TASMOE_AUTH=keys): create, list or revoke; new: a key for a "
                                    "deployment's TASMOE_SERVICE_KEY, stored nowhere")
    p.add_argument("action", choices=["create", "list", "revoke", "new"],
                   help="create a key (printed once), list the keys, revoke one, or print a new unstored key")
    p.add_argument("id", nargs="?", default=None, help="revoke: the key's id (tasmoe keys list)")
    p.add_argument("--scope", choices=["read", "submit", "admin"], default="read",
                   help="create: read (GET), submit (also POST/cancel its own runs) or admin (every principal's)")
    p.add_argument("--principal", default="user", help="create: who the key belongs to (experiments are theirs)")
    p.add_argument("--file", default=None, help="the key file (default: TASMOE_KEYS_FILE or results/keys.json)")
    p.set_defaults(func=_keys)

    p = sub.add_parser("openapi", help="write openapi/<service>.json for every service (sorted keys)")
    p.add_argument("--out", default="openapi", help="output folder (default: openapi)")
    p.set_defaults(func=_openapi)

    owner = COMMANDS.get(only or "")
    loaded = list(SERVICES) if only == ALL_COMMANDS else [owner.service] if owner is not None else []
    for name in loaded:
        mod = optional_module(name, "cli")
        if mod is not None:
            mod.register(sub)
    for cmd, stub in COMMANDS.items():
        if stub.service not in loaded:
            sub.add_parser(cmd, help=stub.help, add_help=False).set_defaults(func=_not_loaded)
    return parser


@contextmanager
def _local_services() -> Iterator[ServiceClients]:
    """The services in this process, wired to one another, for a command that needs another service's answers
    (``tasmoe place`` asks the workload and thermal services): the same HTTP path as a run, no server started."""
    from services.root_app import embedded
    from shared.settings import load_settings

    with embedded(load_settings()) as emb:
        yield emb.clients


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # `tasmoe hotspot ...` imports the thermal service's CLI only, `tasmoe serve thermal` and `tasmoe --help` none.
    parser = build_parser(_command_of(argv))
    args = parser.parse_args(argv)
    try:
        command = COMMANDS.get(args.command)
        if command is not None and not command.settings:
            setup_logging(args.log_level or "WARNING")
        else:
            from shared.settings import load_settings  # pydantic-settings: loaded only by commands that read it

            settings = load_settings()
            setup_logging(args.log_level or settings.log_level, json_lines=settings.log_json)
        args.local_services = _local_services
        rc = args.func(args)
    except TasmoeError as exc:
        print(f"tasmoe {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    return int(rc or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
