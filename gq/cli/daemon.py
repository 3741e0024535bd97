"""gq daemon: start, stop and check the node daemon."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Optional

import typer

from gq import client, defaults, home, messages, validation
from gq.cli import daemon_lifecycle
from gq.daemon.options import parse_lanes, parse_rotate
from gq.errors import MissingExtra, UserError
from gq.exec.cgroups.job_cgroups import KINDS
from gq.units import (
    describe_period,
    format_period,
    format_size_exact,
    parse_address,
    parse_period,
    parse_seconds,
    parse_size,
)

if TYPE_CHECKING:
    pass

app = typer.Typer(
    help="Start, stop or check the node daemon (personal, or the node's shared one with --system).",
    no_args_is_help=True,
)


@app.command()
def start(
    system: bool = typer.Option(
        False,
        "--system",
        help="The node's shared daemon (root): state in /var/lib/gq (GQ_SYSTEM_HOME), socket open to all users.",
    ),
    foreground: bool = typer.Option(False, "--foreground", help="Stay attached (for systemd)."),
    lanes: str = typer.Option(
        "auto",
        "--lanes",
        metavar="auto|N",
        help="Lanes per device: iterations that run at once. auto: one lane, and jobs on lanes of their own at once where measuring them shows it pays; N: N lanes, the device's memory split between them.",
    ),
    checkpoint: str = typer.Option(
        "auto",
        "--checkpoint",
        metavar="auto|off|fake",
        help="How a suspended job's device memory moves to host memory, freeing the device: auto: the CUDA driver's checkpoint API (driver 570 or later) on a GPU, nothing on the cpu device; off: suspended jobs keep their memory; fake: a stand-in on the cpu device, for tests.",
    ),
    max_resident: int = typer.Option(
        defaults.MAX_RESIDENT, "--max-resident", help="Jobs kept resident per device."
    ),
    max_pids: int = typer.Option(
        defaults.MAX_PIDS,
        "--max-pids",
        metavar="N",
        help="Tasks (processes and threads) each job may have at once, its cgroup's pids.max: a fork past it fails in that job alone.",
    ),
    kill_wait: float = typer.Option(
        defaults.KILL_WAIT,
        "--kill-wait",
        metavar="SECONDS",
        help="Seconds between SIGTERM and SIGKILL.",
    ),
    cpu_memory: Optional[str] = typer.Option(
        None,
        "--cpu-memory",
        metavar="SIZE",
        help="Memory the cpu device offers jobs (e.g. 8G) [all RAM].",
    ),
    probe_mem: str = typer.Option(
        format_size_exact(defaults.PROBE_MEMORY),
        "--probe-mem",
        metavar="SIZE",
        help="Device memory a job that declares none (no --gpu-mem) needs free to start; its first iterations then run with the lane to itself, and their measured peak becomes its figure.",
    ),
    probe_wait: str = typer.Option(
        format_period(defaults.PROBE_IDLE_SECONDS),
        "--probe-wait",
        metavar="SECONDS",
        help="How long a probed job may take to begin its first iteration (imports, CUDA's start, loading its model) before its probe ends with nothing measured and its lane opens.",
    ),
    cpu_devices: Optional[int] = typer.Option(
        None,
        "--cpu-devices",
        metavar="N",
        help="Emulate N devices on the cpu (tests, demos): each its own host and share of --cpu-memory.",
    ),
    device_model: Optional[str] = typer.Option(
        None,
        "--device-model",
        metavar="NAME",
        help="Model name of the emulated devices, which --gpus TYPE:N matches (tests, demos).",
    ),
    on_finish: Optional[str] = typer.Option(
        None,
        "--on-finish",
        metavar="CMD",
        help="Run CMD (sh) as each job's owner once it has ended, with GQ_JOB_ID, GQ_JOB_STATE, GQ_JOB_EXIT_CODE, ... set (at most a minute).",
    ),
    attach_wait: str = typer.Option(
        format_period(defaults.ATTACH_WAIT),
        "--attach-wait",
        metavar="SECONDS",
        help="How long a started interactive job (gq run --pty) waits for its gq to take its terminal before it is hung up.",
    ),
    move_margin: float = typer.Option(
        defaults.MOVE_MARGIN,
        "--move-margin",
        metavar="SECONDS",
        help="Under fifo, a resident that has run no iteration moves to a device that would start it this much sooner.",
    ),
    operators: Optional[str] = typer.Option(
        None,
        "--operators",
        metavar="GROUP",
        help="Members of GROUP act on every job and the node, like root.",
    ),
    priority_cap: int = typer.Option(
        defaults.PRIORITY_CAP,
        "--priority-cap",
        metavar="N",
        help="System mode: the highest --priority users may ask for.",
    ),
    max_temp: Optional[float] = typer.Option(
        None,
        "--max-temp",
        metavar="C",
        help=f"Admit no job to a device hotter than C degrees, until {defaults.TEMP_HYSTERESIS:g} under.",
    ),
    max_power: Optional[float] = typer.Option(
        None,
        "--max-power",
        metavar="W",
        help=f"Admit no job to a device drawing more than W watts, until {defaults.POWER_HYSTERESIS:.0%} under.",
    ),
    metrics: Optional[str] = typer.Option(
        None,
        "--metrics",
        metavar="ADDR:PORT",
        help="Serve Prometheus metrics at http://ADDR:PORT/metrics.",
    ),
    client_timeout: float = typer.Option(
        defaults.CONNECTION_IDLE,
        "--client-timeout",
        metavar="SECONDS",
        help="Drop a client that sends no request (or reads no answer) for this long.",
    ),
    readings: Optional[str] = typer.Option(
        None,
        "--readings",
        metavar="FILE",
        help="Overlay recorded device readings (JSON lines) on the samples (tests, demos).",
    ),
    cgroup: str = typer.Option(
        defaults.CGROUP,
        "--cgroup",
        metavar="KIND",
        help="Where each job's processes are kept: auto (v2 if it has controllers, else v1), v2, v1, or off (process groups).",
    ),
    retention: str = typer.Option(
        format_period(defaults.RETENTION),
        "--retention",
        metavar="PERIOD",
        help="Purge finished jobs this long after they end: 30days, 12hours, never.",
    ),
    idle_resident: str = typer.Option(
        format_period(defaults.IDLE_RESIDENT),
        "--idle-resident",
        metavar="PERIOD",
        help="A resident that runs no iteration this long gives its slot to a job that waits for one, where its user holds more than their part of the device's slots: it is requeued (10min, 30s; never).",
    ),
    rotate: Optional[str] = typer.Option(
        None,
        "--rotate",
        metavar="PERIOD",
        help="Under fair and rr, when more jobs want to be resident than fit: a resident whose turn has lasted PERIOD has its memory moved to host memory (as gq suspend does) for a job that waits, and comes back in its turn (10min, 30s; off unless given; idle under other policies).",
    ),
    mps: bool = typer.Option(
        False,
        "--mps",
        help="Start NVIDIA's MPS control daemon (nvidia-cuda-mps-control) for each CUDA device and make jobs its clients, one user's at a time on a device: their lanes then run truly at once, each job's pinned device memory capped at its lane's and its threads at the device's share per lane. gq info says whether it is on, and why not.",
    ),
    fair_half_life: str = typer.Option(
        format_period(defaults.FAIR_HALF_LIFE),
        "--fair-half-life",
        metavar="PERIOD",
        help="Fair share: a user's lane time counts half as much after this long (1day, 12hours; never: no decay), kept across jobs and restarts.",
    ),
    max_pending: int = typer.Option(
        defaults.MAX_PENDING_PER_USER,
        "--max-pending",
        metavar="N",
        help="Pending jobs one user may have (array tasks count one each).",
    ),
    max_array: int = typer.Option(
        defaults.MAX_ARRAY_SIZE, "--max-array", metavar="N", help="Tasks in one job array."
    ),
    max_connections_per_user: int = typer.Option(
        defaults.MAX_CONNECTIONS_PER_USER,
        "--max-connections-per-user",
        metavar="N",
        help="Connections one user may hold open.",
    ),
    max_connections: int = typer.Option(
        defaults.MAX_CONNECTIONS,
        "--max-connections",
        metavar="N",
        help="Connections in total (within the descriptor limit).",
    ),
    max_request: str = typer.Option(
        format_size_exact(defaults.MAX_REQUEST),
        "--max-request",
        metavar="SIZE",
        help="Largest request (a script travels in it).",
    ),
    max_spool: str = typer.Option(
        format_size_exact(defaults.MAX_SPOOL_PER_USER),
        "--max-spool",
        metavar="SIZE",
        help="Script snapshots the spool keeps for one user's jobs; the oldest finished jobs' go first.",
    ),
) -> None:
    """Start the node daemon (detached unless --foreground); its log is daemon.log in its
    state directory. A personal daemon also starts by itself on the first command."""
    try:
        parse_lanes(lanes)
    except ValueError:
        raise UserError(
            f"--lanes {lanes}: give 'auto' or a count from 1 to {defaults.MAX_LANES}"
        ) from None
    if checkpoint not in defaults.CHECKPOINT_KINDS:
        raise UserError(f"--checkpoint {checkpoint[:40]!r}: give auto, off or fake")
    if (
        max_resident < 1
        or kill_wait < 0
        or (cpu_devices is not None and not 1 <= cpu_devices <= 64)
    ):
        raise UserError(
            "--max-resident must be at least 1, --cpu-devices 1 to 64, --kill-wait not negative"
        )
    if (
        (max_temp is not None and max_temp <= 0)
        or (max_power is not None and max_power <= 0)
        or client_timeout <= 0
        or not 0 <= move_margin < 1e9
    ):
        raise UserError(
            "--max-temp, --max-power and --client-timeout must be positive, "
            "--move-margin not negative"
        )
    if metrics is not None:
        parse_address(metrics)
        try:
            import prometheus_client  # noqa: F401 - an extra: only asked whether it is there
        except ImportError:
            raise MissingExtra("--metrics", "metrics") from None
    if readings is not None and not os.path.isfile(readings):
        raise UserError(f"--readings {readings}: no such file")
    if system and os.geteuid() != 0:
        raise UserError(
            "only root starts the system daemon (sudo gq daemon start --system, "
            "or the systemd unit)"
        )
    if not 1 <= max_pids <= defaults.MAX_PIDS_CEILING:
        raise UserError(
            f"--max-pids {max_pids}: give a whole number from 1 to {defaults.MAX_PIDS_CEILING}"
        )
    if cgroup not in KINDS:
        raise UserError(f"--cgroup {cgroup}: choose one of {', '.join(KINDS)}")
    try:
        rotate_s = None if rotate is None else parse_rotate(rotate)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    retention_s = parse_period(retention)
    half_life_s = parse_period(fair_half_life)
    idle_resident_s = parse_period(idle_resident)
    probe_wait_s = parse_seconds(probe_wait, "--probe-wait")
    if not 0 < probe_wait_s <= defaults.MAX_PROBE_WAIT:
        raise UserError(
            f"--probe-wait {probe_wait[:40]}: give a time of more than 0 and at "
            f"most {describe_period(defaults.MAX_PROBE_WAIT)} (60, 90s, 5min)"
        )
    attach_wait_s = parse_seconds(attach_wait, "--attach-wait")
    if not 0 < attach_wait_s <= defaults.MAX_ATTACH_WAIT:
        raise UserError(
            f"--attach-wait {attach_wait[:40]}: give a time of more than 0 and "
            f"at most {describe_period(defaults.MAX_ATTACH_WAIT)} (30, 90s, 5min)"
        )
    request_bytes = parse_size(max_request)
    spool_bytes = parse_size(max_spool)
    for flag, value in (
        ("--max-pending", max_pending),
        ("--max-array", max_array),
        ("--max-connections-per-user", max_connections_per_user),
        ("--max-connections", max_connections),
    ):
        if value < 1:
            raise UserError(f"{flag} must be at least 1")
    if request_bytes < defaults.MAX_SCRIPT + defaults.MAX_JOB_PAYLOAD:
        raise UserError(
            f"--max-request must be at least "
            f"{(defaults.MAX_SCRIPT + defaults.MAX_JOB_PAYLOAD) >> 10}K (a script "
            "of the largest size must fit)"
        )
    if spool_bytes < defaults.MAX_SCRIPT:
        raise UserError(
            f"--max-spool must be at least {defaults.MAX_SCRIPT >> 20}M (a script "
            "of the largest size must fit)"
        )
    target = home.system() if system else home.personal()
    options = [
        "--lanes",
        lanes.strip().lower(),
        "--checkpoint",
        checkpoint,
        "--max-resident",
        str(max_resident),
        "--max-pids",
        str(max_pids),
        "--kill-wait",
        str(kill_wait),
        "--priority-cap",
        str(priority_cap),
        "--client-timeout",
        str(client_timeout),
        "--cgroup",
        cgroup,
        "--retention",
        format_period(retention_s),
        "--fair-half-life",
        format_period(half_life_s),
        "--idle-resident",
        format_period(idle_resident_s),
        "--max-pending",
        str(max_pending),
        "--max-array",
        str(max_array),
        "--max-connections-per-user",
        str(max_connections_per_user),
        "--max-connections",
        str(max_connections),
        "--max-request",
        str(request_bytes),
        "--max-spool",
        str(spool_bytes),
        "--move-margin",
        str(move_margin),
        "--probe-mem",
        str(parse_size(probe_mem)),
        "--probe-wait",
        str(probe_wait_s),
        "--attach-wait",
        str(attach_wait_s),
    ]
    if rotate_s is not None:
        options += ["--rotate", format_period(rotate_s)]
    if mps:
        options.append("--mps")
    if cpu_memory is not None:
        options += ["--cpu-memory", str(parse_size(cpu_memory))]
    if cpu_devices is not None:
        options += ["--cpu-devices", str(cpu_devices)]
    if device_model is not None:
        if cpu_devices is None:
            raise UserError("--device-model names emulated devices; give --cpu-devices too")
        if not device_model.isprintable() or not 0 < len(device_model) <= defaults.MAX_NAME:
            raise UserError(
                f"--device-model {device_model[:60]!r}: give a printable name of "
                f"1 to {defaults.MAX_NAME} characters"
            )
        options += ["--device-model", device_model]
    if operators is not None:
        options += ["--operators", operators]
    if on_finish is not None:
        validation.text(on_finish, "--on-finish", defaults.MAX_TEXT)
        options += ["--on-finish", on_finish]
    for flag, setting in (
        ("--max-temp", max_temp),
        ("--max-power", max_power),
        ("--metrics", metrics),
        ("--readings", readings and os.path.abspath(readings)),
    ):
        if setting is not None:
            options += [flag, str(setting)]
    if foreground:
        from gq.exec.host.spawn import gq_python

        argv = gq_python("gq.daemon", *(["--system"] if system else []), *options)
        os.execv(argv[0], argv)
    from gq.daemon.pidfiles import running_pid

    pid = running_pid(target)
    if pid is not None:
        if mps and "--mps" not in client.ask(messages.NodeInfoRequest(), target).options:
            raise UserError(
                f"gq daemon is already running (pid {pid}) without --mps: stop it first "
                "('gq daemon stop'), then start it with --mps"
            )
        typer.echo(f"gq daemon is already running (pid {pid})")
        return
    client.start_daemon(target, options).close()
    typer.echo(
        f"gq daemon started (pid {running_pid(target)}, {target.mode} mode); "
        f"log: {target.daemon_log}"
    )


# stop, restart and status, registered in the order --help lists them
for command in (daemon_lifecycle.stop, daemon_lifecycle.restart, daemon_lifecycle.status):
    app.command()(command)
