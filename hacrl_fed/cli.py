"""The ``hacrl-fed`` command line (typer).

Each command validates its config before importing anything heavy, so ``--help`` and config
errors are fast. Bad input ends with a one-line error and a non-zero exit code, never a traceback.
"""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(
    name="hacrl-fed",
    help="Collaborative RL between organizations that never share their models (HACPO on Flower).\n\n"
         "A first run: `hacrl-fed simulate` (two real models on this machine, then a report) and `hacrl-fed eval` "
         "on a model. A deployment: `hacrl-fed server` at the coordinator, `hacrl-fed client` at every site.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
keys_app = typer.Typer(help="Identities (Ed25519 signing keys, roster entries) and TLS certificates.", no_args_is_help=True)
app.add_typer(keys_app, name="keys")
route_app = typer.Typer(help="Routing between deployed models at inference: compare policies (route eval), serve a "
                             "router (route serve).", no_args_is_help=True)
app.add_typer(route_app, name="route")


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"hacrl-fed {version('hacrl-fed')}")
        except PackageNotFoundError:
            fail("hacrl-fed is not installed as a package (pip install -e .), so it has no version")
        raise typer.Exit()


@app.callback()
def _main(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """Options of every command (the help text is the app's)."""


def fail(message: str, code: int = 2) -> None:
    """Print a one-line error to stderr and exit with ``code``.

    Every command uses 2 for bad configuration or usage (unknown key, missing file, unknown model,
    key not in the roster …) and 1 for a failure at run time (a process that did not start, a
    model that does not load, a run that failed).
    """
    typer.echo("error: " + "; ".join(line for line in message.splitlines() if line.strip()), err=True)
    raise typer.Exit(code)


ENGINE_HELP = ("Rollout engine: hf (Hugging Face generate, any device) | loop (a decode loop on the same model: "
               "finished rows leave the batch) | ct2 (CTranslate2, float32 by default, CPU; the project's "
               "fast extra, or pip install ctranslate2) | auto (ct2 where it is installed and the device is cpu, "
               "else hf) | vllm (needs device cuda and vllm installed in this environment: docs/engines.md) | a "
               "registered engine or package.module:factory (docs/extending.md).")


def _auto_engine(engine: str, device: str) -> str | None:
    """For ``--engine auto``, the line that says which engine it will run
    (:func:`hacrl_fed.worker.engines.auto_choice`; shown once the inputs have been checked); None otherwise."""
    from hacrl_fed.worker.engines import AUTO, resolve_engine

    if engine != AUTO:
        return None
    chosen = resolve_engine(engine, device)
    why = ("ctranslate2 is installed; float32, the same greedy tokens as hf" if chosen == "ct2" else
           "ctranslate2 is not installed" if device == "cpu" else f"device {device}")
    return f"engine: {chosen} (auto: {why}; --engine hf for Hugging Face generate)"


def _check_model(name_or_path: str, gguf_file: str | None = None, *, label: str = "") -> None:
    """Exit with one line (``label`` before it) when a model name cannot be resolved, without loading or
    downloading anything (:func:`hacrl_fed.worker.models.check_model_name`): code 2 for an unknown name, 1 for an
    alias whose package is missing (the line gives the pip command)."""
    from hacrl_fed.worker.models import ModelLoadError, ModelNotFoundError, check_model_name

    try:
        check_model_name(name_or_path, gguf_file)
    except ModelNotFoundError as err:
        fail(label + _one_line(err))
    except ModelLoadError as err:
        fail(label + _one_line(err), code=1)


def _check_engine(engine: str, *, runs_here: bool = True) -> None:
    """Exit 2 with one line for an unknown engine, or — when the worker runs in this environment — for vllm where
    it is not importable (:func:`hacrl_fed.worker.engines.require_engine`)."""
    from hacrl_fed.registries import ROLLOUT_ENGINES

    try:
        ROLLOUT_ENGINES.check(engine)
    except ValueError as err:
        fail(f"--engine: {err}")
    if runs_here:
        from hacrl_fed.worker.engines import require_engine

        try:
            require_engine(engine)
        except ImportError as err:
            fail(str(err))


def _one_line(err: Exception) -> str:
    """An exception as one line; OSError as ``PATH: reason``."""
    if isinstance(err, OSError) and err.strerror:
        return f"{err.filename}: {err.strerror}" if err.filename else err.strerror
    return " ".join(str(err).split())


@keys_app.command("gen")
def keys_gen(
    name: str = typer.Option(..., "--name", help="Agent name (roster name and key id)."),
    out: Path = typer.Option(..., "--out", help="Directory for the key files (created with mode 0700)."),
    roster: Path | None = typer.Option(None, "--roster", help="Roster TOML to add/replace this agent's entry in."),
    force: bool = typer.Option(False, "--force", help="Overwrite existing key files."),
    role: str = typer.Option("learner", "--role", help="learner (trains) | rollout_only (a site whose model is "
                             "behind an API: contributes rollouts, is never sent a train order; docs/cross-vendor.md). "
                             "Written into the roster entry."),
) -> None:
    """Write NAME.ed25519.key/.pub (batch signing) and NAME.node.key/.pub (SuperNode auth, EC P-384 OpenSSH)."""
    from hacrl_fed.protocol.keys import ROLES, KeyFileError, Roster, RosterError, generate_identity, update_roster

    if role not in ROLES:
        fail(f"--role must be one of {', '.join(ROLES)}, got {role!r}")
    try:
        if roster is not None and roster.exists():
            Roster.load(roster)  # a broken roster fails before any key is written
        ident = generate_identity(name, out, force=force)
        if roster is not None:
            update_roster(roster, ident.name, ident.ed25519, ident.node_public, role=role)
    except (KeyFileError, RosterError, ValueError, OSError) as err:
        fail(_one_line(err))
    for path in (ident.signing_key, ident.signing_pub, ident.node_key, ident.node_pub):
        typer.echo(f"wrote {path}", err=True)
    if roster is not None:
        typer.echo(f"updated {roster}", err=True)
    typer.echo(ident.roster_entry(role), nl=False)


@keys_app.command("certs")
def keys_certs(
    out: Path = typer.Option(..., "--out", help="Directory for ca.crt, ca.key, server.pem, server.key."),
    san: list[str] = typer.Option(..., "--san", help="Subject alternative name (IP or DNS); repeat for more."),
    days: int = typer.Option(365, "--days", help="Validity in days."),
    force: bool = typer.Option(False, "--force", help="Overwrite existing files."),
) -> None:
    """Write a private CA and a SuperLink TLS server certificate signed by it."""
    from hacrl_fed.protocol.certs import generate_tls
    from hacrl_fed.protocol.keys import KeyFileError

    try:
        files = generate_tls(out, san, days=days, force=force)
    except (KeyFileError, ValueError, OSError) as err:
        fail(_one_line(err))
    for path in (files.ca_cert, files.ca_key, files.server_cert, files.server_key):
        typer.echo(f"wrote {path}")


def worker_cmd(
    config: Path = typer.Option(..., "--config", help="client.toml of the site."),
    name: str | None = typer.Option(None, "--name", help="Override agent.name."),
    model: str | None = typer.Option(None, "--model", help="Override agent.model.name_or_path."),
    device: str | None = typer.Option(None, "--device", help="Override agent.model.device."),
    address: str | None = typer.Option(None, "--address", help="Bind address: 127.0.0.1:PORT (0 = free) or unix:/path."),
    address_file: Path | None = typer.Option(None, "--address-file", help="Write the bound address here when healthy."),
    no_resume: bool = typer.Option(False, "--no-resume", help="Ignore existing checkpoints."),
    status_file: Path | None = typer.Option(None, "--status-file", help="Keep the worker's current phase here "
                                            "(JSON: loading, generating with tokens/s, training k/M …)."),
    engine: str | None = typer.Option(None, "--engine", help=ENGINE_HELP + " Overrides agent.model.engine."),
    token_file: Path | None = typer.Option(None, "--token-file",
                                           help="The site's worker token: every call to this worker must carry it. "
                                                "Read from this file, or written there (mode 0600) when it does not "
                                                "exist; default <output_dir>/<agent>/worker.token. Give the same "
                                                "file to `hacrl-fed client --worker-token-file`."),
) -> None:
    """Advanced: run only the site's agent worker (the process that owns the model).

    For a worker in a GPU container or another Python environment; `hacrl-fed client --worker-address`
    attaches a site to it (with the token of --token-file: every call must carry it)."""
    from hacrl_fed.config import ClientConfig, ConfigError, load_config, parse_config

    try:
        cfg = load_config(config, ClientConfig)
        if name:
            cfg.agent.name = name
        if model:
            cfg.agent.model.name_or_path = model
        if device:
            cfg.agent.model.device = device
        if engine:
            _check_engine(engine, runs_here=False)
            cfg.agent.model.engine = engine
        _check_engine(cfg.agent.model.engine)
        cfg = parse_config(cfg.model_dump(), ClientConfig, str(config))   # the overrides checked like the file
        from hacrl_fed.worker.service import check_bind_address

        check_bind_address(address or cfg.agent.worker_address)
    except (ConfigError, ValueError) as err:
        fail(_one_line(err))
    from hacrl_fed.atomic import LockedError
    from hacrl_fed.protocol.keys import KeyFileError, RosterError
    from hacrl_fed.checkpoints.store import CheckpointError
    from hacrl_fed.worker.models import ModelLoadError, ModelNotFoundError
    from hacrl_fed.worker.service import run_worker

    _worker_logging()
    try:
        factory = None
        if cfg.agent.endpoint is not None:        # a rollout-only site: rollouts from an API endpoint, no weights
            from hacrl_fed.contributor import EndpointWorker as factory
        run_worker(cfg, address=address, address_file=str(address_file) if address_file else None,
                   resume=not no_resume, status_file=str(status_file) if status_file else None,
                   token_file=str(token_file) if token_file else None, factory=factory)
    except (ModelNotFoundError, KeyFileError, RosterError, LockedError, ValueError) as err:
        fail(_one_line(err))
    except (ModelLoadError, CheckpointError, RuntimeError, OSError) as err:
        fail(_one_line(err), code=1)


def _worker_logging() -> None:
    """``hacrl_fed.*`` INFO lines to stdout (``hacrl-fed client`` shows the worker's progress lines from there)."""
    from hacrl_fed.logs import log_to_stdout

    log_to_stdout()


def eval_cmd(
    model: str = typer.Option(..., "--model", help="Hub id, local directory, .gguf file or alias (smollm2-135m-instruct)."),
    data: Path = typer.Option(..., "--data", help="Problems: .jsonl, .json or .parquet with the columns problem "
                              "(or question, prompt) and answer (or solution), id optional."),
    samples: int = typer.Option(1, "--samples", min=1, help="k responses per problem (avg@k, pass@k)."),
    out: Path | None = typer.Option(None, "--out", help="Per-problem results (JSONL, written atomically)."),
    max_new_tokens: int = typer.Option(256, "--max-new-tokens", min=1, help="Generation cap per response."),
    limit: int | None = typer.Option(None, "--limit", min=1, help="Evaluate only the first N problems."),
    temperature: float | None = typer.Option(None, "--temperature", min=0.0,
                                             help="Default: 0 (greedy) for --samples 1, else 1.0."),
    top_p: float = typer.Option(1.0, "--top-p", min=0.0, max=1.0,
                                help="Nucleus sampling: sample from the smallest set of tokens with this total "
                                     "probability (1 = off)."),
    seed: int = typer.Option(0, "--seed", help="Sampling seed: the same seed draws the same responses."),
    device: str = typer.Option("cpu", "--device", help="Where the model runs: cpu, cuda, cuda:1 ..."),
    dtype: str = typer.Option("float32", "--dtype", help="float32 | bfloat16 | float16"),
    template: str | None = typer.Option(None, "--template", help="auto (chat template if any) | plain. Default: "
                                        "the template an export was trained with (its hacrl_fed_prompt.json), "
                                        "else auto."),
    system_prompt: str | None = typer.Option(None, "--system-prompt", help="Instruction before every problem. "
                                             "Default: the system prompt an export was trained with, else the "
                                             "training default (asking for a \\boxed{} answer)."),
    stop: list[str] | None = typer.Option(None, "--stop", help="A string that ends a response (repeat for more; "
                                          "--stop '' for none). Default: an export's stop strings, else the "
                                          "template's (\"\\nQuestion:\" under the plain template)."),
    answer_style: str | None = typer.Option(None, "--answer-style", help="A registered answer style: boxed, gsm8k or one a "
                                        "module registers (docs/extending.md; default: from the data)."),
    batch_size: int = typer.Option(32, "--batch-size", min=1, help="Sequences per generate call."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as one JSON line (for scripts) "
                                 "instead of the readable table."),
    engine: str = typer.Option("auto", "--engine", help=ENGINE_HELP),
) -> None:
    """Evaluate a model on math problems with the training verifier: avg@k and pass@k."""
    import json

    from pydantic import ValidationError

    from hacrl_fed.config import format_validation_error, vllm_devices

    if engine == "vllm" and device not in vllm_devices():
        fail(f"--engine vllm runs on a GPU: give --device cuda (got --device {device}; for another GPU set "
             f"CUDA_VISIBLE_DEVICES)")
    _check_engine(engine)
    engine_line = _auto_engine(engine, device)    # auto stays auto: its factory falls back to hf if ct2 cannot
    from hacrl_fed.play.evaluate import DataError, check_data_head, eval_model_config

    try:                                         # how an export was prompted in training, if it says
        model_cfg, saved = eval_model_config(model, template=template, system_prompt=system_prompt, stop=stop,
                                             device=device, dtype=dtype, engine=engine)
    except ValidationError as err:
        fail(format_validation_error(err, "options").replace("\n", "; "))
    except ValueError as err:
        fail(_one_line(err))
    if saved is not None:
        path, rec = saved
        trained = "plain" if rec["template"] == "plain" else "auto"   # the ModelConfig value of the saved kind
        shown = rec["template"] if model_cfg.chat_template == trained else model_cfg.chat_template
        announce = (f"prompt as in training ({path}; flags override): template {shown}, system prompt "
                    f"\"{model_cfg.system_prompt}\", stop strings {model_cfg.stop}")
    if not data.is_file():
        fail(f"{data}: no such data file")
    try:                                         # the data's first rows, before the model loads
        check_data_head(data, answer_style=answer_style)
    except DataError as err:
        fail(_one_line(err))
    _check_model(model_cfg.name_or_path, model_cfg.gguf_file)   # before anything is announced or loaded
    if saved is not None:
        typer.echo(announce, err=True)
    if engine_line:
        typer.echo(engine_line, err=True)
    _cli_logging()                               # progress on stderr: model load, an engine's conversion
    from hacrl_fed.rollout.engine import Sampling
    from hacrl_fed.worker.eval_model import run_eval
    from hacrl_fed.worker.models import ModelLoadError, ModelNotFoundError

    try:
        sampling = Sampling(temperature=(0.0 if samples == 1 else 1.0) if temperature is None else temperature,
                            top_p=top_p, max_new_tokens=max_new_tokens)
        summary = run_eval(model_cfg, str(data), samples=samples, out=str(out) if out else None, sampling=sampling,
                           limit=limit, seed=seed, answer_style=answer_style, max_batch_sequences=batch_size)
    except (ModelNotFoundError, DataError) as err:   # DataError: a bad data file, found before the model loads
        fail(_one_line(err))
    except (ModelLoadError, ValueError, OSError, RuntimeError) as err:   # RuntimeError: vLLM's own failures
        fail(_one_line(err), code=1)
    if as_json:
        typer.echo(json.dumps(summary, sort_keys=True))
        return
    from hacrl_fed.play.evaluate import format_summary

    typer.echo(format_summary(summary, model=model, data=str(data), temperature=sampling.temperature,
                              max_new_tokens=max_new_tokens, out=str(out) if out else None))


def _cli_logging() -> None:
    import logging

    from hacrl_fed.logs import LOG_FORMAT

    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)


def server_cmd(
    config: Path = typer.Option(..., "--config", help="server.toml (paths inside are relative to the current directory)."),
) -> None:
    """Coordinator host: flower-superlink (TLS, SuperNode auth), roster registration and the HACRL run."""
    from hacrl_fed.config import ConfigError, ServerConfig, load_config
    from hacrl_fed.launch.server_cmd import resolve_server_config, run_server
    from hacrl_fed.protocol.keys import RosterError

    _cli_logging()
    try:
        code = run_server(resolve_server_config(load_config(config, ServerConfig)))
    except (ConfigError, RosterError, ValueError) as err:  # StateError: a resume with other settings
        fail(_one_line(err))
    except (RuntimeError, OSError) as err:
        fail(_one_line(err), code=1)
    raise typer.Exit(code)


def client_cmd(
    config: Path | None = typer.Option(None, "--config", help="client.toml of the site (flags below override it)."),
    model: str | None = typer.Option(None, "--model", help="Model: hub id, directory, .gguf or alias (agent.model.name_or_path)."),
    name: str | None = typer.Option(None, "--name", help="Agent name, as in the roster (agent.name)."),
    server: str | None = typer.Option(None, "--server", help="Coordinator SuperLink HOST:PORT (superlink)."),
    root_certificates: Path | None = typer.Option(None, "--root-certificates", help="Coordinator CA certificate."),
    node_key: Path | None = typer.Option(None, "--node-key", help="SuperNode EC private key registered at the coordinator."),
    insecure: bool = typer.Option(False, "--insecure", help="Plain HTTP to the SuperLink (loopback testing only)."),
    port: int | None = typer.Option(None, "--port", min=1, max=65535,
                                    help="Local port (127.0.0.1) on which this site's relay to the coordinator "
                                         "hands orders to its worker; default: a free one. Set it only when that "
                                         "port must be known in advance."),
    device: str | None = typer.Option(None, "--device", help="Override agent.model.device (cpu, cuda:1 ...)."),
    output_dir: Path | None = typer.Option(None, "--output-dir", help="Override output_dir."),
    worker_address: str | None = typer.Option(None, "--worker-address",
                                              help="Attach to a running worker (loopback/unix) instead of starting one."),
    worker_token_file: Path | None = typer.Option(None, "--worker-token-file",
                                                  help="The worker token file (mode 0600) every call to the worker "
                                                       "carries: with --worker-address the file that worker uses "
                                                       "(`hacrl-fed worker --token-file`), else where this client "
                                                       "writes a fresh one. Default "
                                                       "<output_dir>/<agent>/worker.token."),
    run_id: str | None = typer.Option(None, "--run-id", help="The coordinator's run id (run_id): refuse to start "
                                      "with checkpoints of another run."),
    engine: str | None = typer.Option(None, "--engine", help=ENGINE_HELP + " Overrides agent.model.engine; with "
                                      "--worker-address the attached worker must run this engine."),
    endpoint: str | None = typer.Option(None, "--endpoint", help="Rollout-only site: base URL of an "
                                        "OpenAI-compatible API (http://HOST:PORT/v1) whose model generates this "
                                        "site's rollouts; never trained (agent.endpoint.url; docs/cross-vendor.md)."),
    api_model: str | None = typer.Option(None, "--api-model", help="The endpoint's model name (with --endpoint; "
                                         "agent.model.name_or_path). The API key, if any, comes from the "
                                         "environment variable agent.endpoint.api_key_env names."),
) -> None:
    """Site: the agent worker (owns the model) plus a flower-supernode that couriers messages to it."""
    from pydantic import ValidationError

    from hacrl_fed.config import ClientConfig, ConfigError, format_validation_error, load_config
    from hacrl_fed.launch.client_cmd import fill_site_layout, resolve_client_config, run_client

    _cli_logging()
    if engine is not None:                         # without --worker-address this site starts its worker here
        _check_engine(engine, runs_here=worker_address is None)
    try:
        if config is not None:
            data = load_config(config, ClientConfig).model_dump(exclude_unset=True)
        elif model and name:
            data = {"agent": {"name": name, "model": {"name_or_path": model}}}
        elif endpoint and api_model and name:
            data = {"agent": {"name": name, "model": {"name_or_path": api_model}}}
        else:
            raise ConfigError("give --config client.toml, or at least --model and --name (or --endpoint, "
                              "--api-model and --name)")
        if model and (endpoint or api_model):
            raise ConfigError("--model is a model this site runs; --endpoint/--api-model a model behind an API: "
                              "give one of them")
        agent = data.setdefault("agent", {})
        overrides = {"name": name, "model.name_or_path": model or api_model, "model.device": device,
                     "model.engine": engine, "endpoint.url": endpoint}
        for key, value in overrides.items():
            if value is not None:
                section, _, field = key.rpartition(".")
                (agent.setdefault(section, {}) if section else agent)[field] = value
        top = {"superlink": server, "root_certificates": root_certificates and str(root_certificates),
               "node_key": node_key and str(node_key), "output_dir": output_dir and str(output_dir),
               "run_id": run_id}
        data.update({k: v for k, v in top.items() if v is not None})
        if insecure:
            data["insecure"] = True
        cfg = resolve_client_config(fill_site_layout(ClientConfig.model_validate(data)))
    except ValidationError as err:
        fail(format_validation_error(err, str(config or "options")).replace("\n", "; "))
    except ConfigError as err:
        fail(_one_line(err))
    if worker_address is None:
        _check_engine(cfg.agent.model.engine)      # this site starts its worker in this environment
    from hacrl_fed.atomic import LockedError

    try:
        code = run_client(cfg, port=port, worker_address=worker_address,
                          worker_token_file=worker_token_file.absolute() if worker_token_file else None)
    except (ConfigError, LockedError, ValueError) as err:
        fail(_one_line(err))
    except OSError as err:
        fail(_one_line(err), code=1)
    raise typer.Exit(code)


def simulate_cmd(
    config: Path | None = typer.Option(None, "--config", help="simulate.toml (default: the built-in demo, "
                                       "examples/default.toml). Paths inside are relative to the current directory."),
    output_dir: Path | None = typer.Option(None, "--output-dir", help="Override run.output_dir (runs/)."),
    run_name: str | None = typer.Option(None, "--run-name", help="Run directory name and run id (default: "
                                        "run.run_id and the start time, e.g. hacrl-demo-20261202-044815). Sampling "
                                        "does not depend on it: the seeds come from run.seed, the step and the "
                                        "agent."),
    tls: bool = typer.Option(False, "--tls", help="TLS + SuperNode authentication on loopback (sets tls = true)."),
    steps: int | None = typer.Option(None, "--steps", min=1, help="Override run.steps, e.g. --steps 2 for a short "
                                     "trial of a config."),
    resume: Path | None = typer.Option(None, "--resume", help="Continue this run directory (configs and keys inside)."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Live progress display."),
) -> None:
    """All agents on this machine over loopback: SuperLink, one worker + SuperNode per agent, then a report."""
    from hacrl_fed.config import ConfigError, SimulateConfig, load_config
    from hacrl_fed.launch.simulate import SimulationError, default_config, run_simulation

    try:
        if resume is not None and (config is not None or tls or output_dir is not None or run_name is not None
                                   or steps is not None):
            raise ConfigError("--resume takes its configuration from the run directory; "
                              "drop --config/--tls/--output-dir/--run-name/--steps")
        run = {"steps": steps} if steps is not None else None
        cfg = None if resume is not None else load_config(config, SimulateConfig, run=run) if config \
            else default_config(run=run)
        if cfg is not None and tls:
            cfg.tls = True
        from hacrl_fed.launch.preflight import check_resume, check_simulate

        if cfg is not None:  # every file, model and path the run needs, before any process starts
            check_simulate(cfg, output_dir)
        else:
            check_resume(resume)
        result = run_simulation(cfg, output_dir=output_dir, run_name=run_name, resume=resume, progress=progress)
    except (ConfigError, ValueError) as err:
        fail(_one_line(err))
    except SimulationError as err:  # the first line is the reason, then the failing process's log tail
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1) from None
    except (RuntimeError, OSError) as err:
        fail(_one_line(err), code=1)
    raise typer.Exit(result.exit_code)


def route_eval_cmd(
    model: list[str] = typer.Option(..., "--model", help="NAME=DIR_OR_URL: an exported model directory, hub id or "
                                    "alias (run here) or an OpenAI-compatible base URL http(s)://…/v1. Repeat: two "
                                    "or more."),
    data: Path = typer.Option(..., "--data", help="Queries to route: .jsonl/.json/.parquet with problem and answer "
                              "columns and a source column naming each query's task (optional), or a run's .toml "
                              "config: its held-out problems, each with its task."),
    eval_size: int | None = typer.Option(None, "--eval-size", min=1, help="With a .toml --data: held-out problems "
                                         "per task (default: the config's data.eval_size)."),
    calibration: Path | None = typer.Option(None, "--calibration", help="Calibration queries (same format). "
                                            "Default: --calibration-frac of --data, per task."),
    calibration_frac: float = typer.Option(0.5, "--calibration-frac", min=0.01, max=0.99,
                                           help="Share of each task of --data used to fit the policies when "
                                                "--calibration is not given."),
    out: Path = typer.Option(Path("runs/route"), "--out", help="route.json, route.md, route.png, router.json and "
                             "each model's cached outcomes (a rerun reuses them)."),
    k: int = typer.Option(10, "--k", min=1, help="Neighbours of the kNN router."),
    embedder: str = typer.Option("tfidf", "--embedder", help="Query embedding: tfidf (scikit-learn, character "
                                 "n-grams, nothing to download) or a local model directory (mean-pooled hidden "
                                 "states)."),
    cost: str = typer.Option("param_tokens", "--cost", help="What a policy saves: param_tokens (parameters × "
                             "response tokens) | tokens | seconds (measured here)."),
    max_new_tokens: int = typer.Option(64, "--max-new-tokens", min=1, help="Generation cap per response."),
    system_prompt: str | None = typer.Option(None, "--system-prompt", help="Default: the system prompt an export "
                                             "was trained with, else the training default."),
    limit: int | None = typer.Option(None, "--limit", min=2, help="Use only the first N queries of --data."),
    params: list[str] | None = typer.Option(None, "--params", help="NAME=135M: an endpoint's parameter count (local "
                                            "models are counted)."),
    api_model: list[str] | None = typer.Option(None, "--api-model", help="NAME=MODEL: the model name an endpoint "
                                               "serves (default NAME)."),
    api_key_env: list[str] | None = typer.Option(None, "--api-key-env", help="NAME=VAR: the environment variable "
                                                 "holding that endpoint's API key."),
    capability: Path | None = typer.Option(None, "--capability", help="A run's report.json: adds best_per_task "
                                           "from the federation's per-task held-out accuracy (agent names = "
                                           "--model names)."),
    batch_size: int = typer.Option(8, "--batch-size", min=1, help="Queries per generate call of a local model."),
    device: str = typer.Option("cpu", "--device", help="Where local models run."),
    engine: str = typer.Option("auto", "--engine", help=ENGINE_HELP + " Generates every local model's "
                               "responses (endpoints are not affected)."),
    timeout_s: float = typer.Option(120.0, "--timeout-s", min=1.0, help="Seconds per endpoint request."),
    seed: int = typer.Option(0, "--seed", help="Calibration split and bootstrap seed."),
    as_json: bool = typer.Option(False, "--json", help="Print route.json's summary as one JSON line."),
) -> None:
    """Compare routing policies on held-out queries: best single, best per task, kNN, cost-aware, random, oracle."""
    import json

    from hacrl_fed.route.evaluate import COST_KINDS
    from hacrl_fed.route.measure import parse_model_specs
    from hacrl_fed.route.run import capability_from_report, load_queries, run_route_eval
    from hacrl_fed.play.evaluate import DataError

    if cost not in COST_KINDS:
        fail(f"--cost must be one of {', '.join(COST_KINDS)}, got {cost!r}")
    from hacrl_fed.config import vllm_devices

    if engine == "vllm" and device not in vllm_devices():
        fail(f"--engine vllm runs on a GPU: give --device cuda (got --device {device}; for another GPU set "
             f"CUDA_VISIBLE_DEVICES)")
    _check_engine(engine)
    engine_line = _auto_engine(engine, device)    # auto stays auto: its factory falls back to hf if ct2 cannot
    try:
        specs, keys = parse_model_specs(model, api_model or [], params or [], api_key_env or [])
        from hacrl_fed.route.embed import load_embedder

        load_embedder(embedder)
        problems = load_queries(data, eval_size)
        cal = load_queries(calibration, eval_size) if calibration is not None else None
        caps = capability_from_report(capability) if capability is not None else None
    except (DataError, ValueError, OSError) as err:
        fail(_one_line(err))
    if limit is not None:
        problems = problems[:limit]
    for spec in specs:                           # an unknown local model fails before anything is announced
        if not spec.is_endpoint:
            _check_model(spec.target, label=f"--model {spec.name}: ")
    _cli_logging()
    if engine_line and not all(s.is_endpoint for s in specs):    # endpoints are not affected
        typer.echo(engine_line, err=True)
    from hacrl_fed.worker.models import ModelLoadError, ModelNotFoundError

    shown: dict[str, int] = {}

    def progress(name: str, done: int, total: int) -> None:   # a line per 50 queries answered, and at the end
        if done == total or done // 50 > shown.get(name, 0) // 50:
            shown[name] = done
            typer.echo(f"route: {name} {done}/{total} queries", err=True)

    try:
        result = run_route_eval(specs, problems, cal, out, calibration_frac=calibration_frac, seed=seed, k=k,
                                embedder=embedder, cost_kind=cost, max_new_tokens=max_new_tokens,
                                system_prompt=system_prompt, batch_size=batch_size, device=device,
                                engine=engine, timeout_s=timeout_s, api_keys=keys, capability=caps, progress=progress)
    except (DataError, ModelNotFoundError) as err:
        fail(_one_line(err))
    except (ModelLoadError, ValueError, OSError, RuntimeError) as err:
        fail(_one_line(err), code=1)
    if as_json:
        typer.echo(json.dumps({p: {k_: v for k_, v in r.items() if k_ != "per_query_accuracy"}
                               for p, r in result["policies"].items()} | {"match": result["match"]},
                              sort_keys=True, default=float))
        return
    from hacrl_fed.route.report import format_table

    typer.echo(format_table(result) + f"files: {', '.join(result['files'].values())}")


route_app.command("eval")(route_eval_cmd)


@route_app.command("serve")
def route_serve_cmd(
    model: list[str] = typer.Option(..., "--model", help="A backend NAME=URL: URL is the OpenAI-compatible API base "
                                    "of a model server (http://HOST:PORT/v1: vLLM, transformers serve, a hosted API); "
                                    "NAME is what a client may ask for (model) and what the x-hacrl-routed-model "
                                    "header says. Repeat for more."),
    order: str | None = typer.Option(None, "--order", help="Fixed preference order NAME,NAME,...: the first backend "
                                     "answers, the next ones take over in this order when it fails. Default: the "
                                     "order of --model; names left out follow in that order."),
    api_model: list[str] | None = typer.Option(None, "--api-model", help="NAME=MODEL: the model name sent to "
                                               "backend NAME (default NAME), e.g. the model id its server loaded. "
                                               "Repeatable."),
    api_key_env: list[str] | None = typer.Option(None, "--api-key-env", help="NAME=VAR: backend NAME's API key is "
                                                 "in the environment variable VAR (sent as a bearer token, never "
                                                 "logged). Repeatable."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0: every interface)."),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="Port to listen on (0: a free one, logged at "
                             "start)."),
    timeout_s: float = typer.Option(120.0, "--timeout-s", help="Seconds a backend may take to answer (a stream: to "
                                    "send its first chunk, then between chunks) before the next one is tried."),
    router_file: Path | None = typer.Option(None, "--router", help="router.json written by `hacrl-fed route eval`: "
                                            "each request goes to the backend the kNN router predicts best for its "
                                            "last user message (the rest follow by prediction). Its model names "
                                            "must be --model names. Overrides --order."),
    target: float | None = typer.Option(None, "--target", min=0.0, max=1.0, help="With --router: cost-aware "
                                        "routing, the cheapest backend predicted to reach this accuracy first "
                                        "(route eval's cost_aware@τ)."),
) -> None:
    """An OpenAI-compatible router (POST /v1/chat/completions) in front of several model servers, with fallback."""
    from hacrl_fed.route.serve import backends_from_options, build_app, fixed_order, serve

    try:
        backends = backends_from_options(model, api_models=api_model or (), api_key_envs=api_key_env or (),
                                         timeout_s=timeout_s)
        names = [b.name for b in backends]
        if target is not None and router_file is None:
            raise ValueError("--target needs --router")
        if router_file is not None:
            from hacrl_fed.route.router import Router

            rank = Router.load(router_file).request_ranker(names, target)
            how = (f"kNN router {router_file}" + (f", cost-aware at target {target:g}" if target is not None else "")
                   + "; fallback by prediction")
        else:
            rank = fixed_order(names, order)
            how = "fixed order " + ",".join(rank({}))
        router = build_app(backends, rank)
    except ValueError as err:
        fail(_one_line(err))
    _cli_logging()
    import logging

    logging.getLogger("hacrl_fed.route").info("route: routing by %s", how)
    try:
        serve(router, host, port)
    except ValueError as err:
        fail(_one_line(err))
    except (RuntimeError, OSError) as err:
        fail(_one_line(err), code=1)


# `hacrl-fed --help` lists them in this order: a first run (simulate, eval), the deployment (server, client),
# then the advanced worker; `keys` follows as a group
for _name, _command in (("simulate", simulate_cmd), ("eval", eval_cmd), ("server", server_cmd),
                        ("client", client_cmd), ("worker", worker_cmd)):
    app.command(_name)(_command)


if __name__ == "__main__":  # pragma: no cover
    app()
