"""Every tunable of gq in one place (as rq keeps ``rq/defaults.py``)."""

# The client-daemon protocol's version (gq/messages/): one more with every change a
# daemon of the version before would misread.
PROTOCOL_VERSION = 11

# Daemon
POLL_PERIOD = 1.0  # rescan the queue this often even when no request changed it
# Rescan at most this often when requests and exits keep changing it: a burst of them is
# scanned once (the scan orders every pending job), a lone change at once.
SCAN_GAP = 0.002
# A pass reads again only the pending jobs changed since the last; all of them this often
# (a write from outside the daemon, which no trigger of its connection sees).
PENDING_REREAD_PERIOD = 10.0
# Finished jobs a status or history request gets at most (newest first; the client asks for
# older pages): a node that has run a month of jobs answers as fast as a new one, and no
# request holds the daemon's loop for long.
LIST_PAGE = 2_000
LISTED_FINISHED = 100  # what gq status --all and gq history show unless given --limit
# A listing of more jobs than this (each array task counted, an array's folded tasks one)
# is made in a child of the daemon, off its loop, from a connection of its own: one child
# per user at a time, a few in all; their other big listings wait, in turns across users.
# Made in the loop, such a listing costs it about 0.05 ms a job.
LIST_INLINE = 200
LISTING_CHILDREN = 4
LISTING_CHILDREN_PER_USER = 1
LISTING_NICE = 10  # the listing children yield the CPUs to jobs and to the daemon
# Requests ready at once are served one per turn of the loop, the caller that has used the
# least of it lately first: its use decays with this half-life (seconds). A user who floods
# the daemon waits behind everyone else, not in front of them.
TURN_HALF_LIFE = 5.0
FLUSH_PERIOD = 1.0  # write jobs' progress to the queue this often
HOST_RESTART_DELAY = 1.0  # wait before replacing an execution host that died
LANES = 1  # iterations that may run at once on one device (--lanes N; auto: measured)
MAX_LANES = 64
MAX_RESIDENT = 4  # jobs kept resident on one device
# A resident that runs no iteration this long gives its slot to a job that waits for one,
# where its user holds more than their part of the device's slots (--idle-resident): it is
# requeued. Loading a large model or data set before the first iteration fits well within.
IDLE_RESIDENT = 600.0
# A resident is idle while it uses less than this share of the time on its lane (an empty
# iteration now and then keeps no slot); one that has used less in all its run loses
# next to nothing when requeued, and may give its slot back without --requeue.
ACTIVE_SHARE = 0.01
# --rotate PERIOD (off unless given): under fair and rr, a resident whose turn has lasted it
# goes to host memory for a job that waits for room (gq.daemon.scheduling.rotation). The
# longest: a week. A move out and back takes seconds per GPU: a rotation's move that takes
# more than this share of the period is logged as a warning.
MAX_ROTATE = 7 * 86400.0
ROTATION_COST_SHARE = 0.1
KILL_WAIT = 10.0  # seconds between SIGTERM and SIGKILL
STOP_GRACE = 5.0  # beyond the kill wait, how long a stopping daemon waits for its jobs
PRIORITY_CAP = 0  # in system mode, the highest --priority a non-operator may ask for
RETENTION = 30 * 86400.0  # finished jobs, their events and snapshots are kept this long
PURGE_PERIOD = 60.0  # look for finished jobs past the retention this often
HEAP_TRIM_PERIOD = 10.0  # hand the daemon's freed heap pages back to the system this often
PURGE_BATCH = 2000  # jobs purged in one transaction (the loop serves clients in between)

# What one user may ask of a shared node (daemon options; 'gq info' shows them)
MAX_PENDING_PER_USER = 10_000  # jobs a user may have pending (array tasks count one each)
MAX_ARRAY_SIZE = 10_000  # tasks in one array, checked before the spec is expanded
MAX_WAITED = 100_000  # jobs one gq wait waits for
# A resident that has run no iteration moves to another device that would start it this
# many seconds sooner (fifo: behind residents that end later); the daemon's --move-margin.
MOVE_MARGIN = 5.0

# Forecasts (gq status --start, gq submit --test-only): the simulator run on the live queue
# in a child of the daemon, never in its loop
FORECAST_PERIOD = 1.0  # at most this often, and only when the queue or its progress changed
FORECAST_SPACING = 10.0  # ... and no sooner than this many times the CPU the last one took
FORECAST_BUDGET = 2.0  # seconds one simulation may take; jobs it did not reach are unknown
FORECAST_NICE = 10  # the child yields the CPUs to jobs and to the daemon
FORECAST_HISTORY = 5  # a user's recent completed jobs of one name that estimate another
FORECAST_HISTORY_TTL = 30.0  # seconds that estimate is kept before it is read again
FORECAST_TYPICAL = 50  # the node's recent completed jobs whose median run a job of unknown
# length (no --steps, -t or earlier runs) is simulated to take, so its neighbours get a bound
FORECAST_HISTORY_READS = 500  # ... and at most this many read for one forecast (the rest later)
MAX_TEST_ONLY_PER_USER = 2  # gq submit --test-only requests a user may have waiting at once
MAX_TEST_ONLY = 32  # ... and all users together

# Hooks (--notify, --on-finish, mail), run as the job's owner when its state changes
HOOK_TIMEOUT = 60.0  # seconds a hook may run; then it is killed
MAX_RUNNING_HOOKS = 16  # at once, node-wide
MAX_RUNNING_HOOKS_PER_USER = 4  # at once, of one user's jobs: the others' go on meanwhile
MAX_QUEUED_HOOKS_PER_USER = 1_000  # waiting to run; past it, more are dropped (logged)
HOOK_EVENTS_PER_PASS = 1_000  # job events looked at per scheduling pass
HOOK_LOOK_PERIOD = 0.1  # look for events that set hooks off at most this often
HOOK_SAVE_PERIOD = 1.0  # write how far events were read at most this often (no hook queued)
MAX_CONNECTIONS_PER_USER = 64  # open connections of one uid
MAX_CONNECTIONS = 1024  # open connections in total (less than the descriptor limit allows)
MAX_REQUEST = 8 << 20  # bytes in one request line (a script snapshot travels in it)
MAX_BUFFERED_PER_USER = 64 << 20  # bytes of one uid's requests and unread answers held
DESCRIPTOR_RESERVE = 128  # descriptors kept for the database, hosts, logs and helpers

ON_OOM = "requeue"  # what a job does at an out-of-memory unless --oom says (or "fail")
OUTPUT = "gq-%j.out"  # a job's stdout (and stderr) unless --output says (sbatch's: slurm-%j.out)

# What one job may carry (checked by the client, again by the daemon)
MAX_SCRIPT = 4 << 20  # bytes of a script snapshot (Slurm's default max_script_size)
MAX_SPOOL_PER_USER = 1 << 30  # bytes of snapshots the spool keeps for one user's jobs
MAX_JOB_PAYLOAD = 256 << 10  # bytes of environment plus arguments, as JSON on the wire
MAX_COMMAND = 64 << 10  # characters of the command line a job keeps as the user gave it
MAX_NAME = 255  # characters of a job name
MAX_PATH = 4096  # characters of a path (Linux's PATH_MAX)
MAX_TEXT = 4096  # characters of other free text: a reason, a dependency, a filter
MAX_PRIORITY = (1 << 31) - 1  # --priority within ±this (Slurm's are 32-bit)
MAX_TIME_LIMIT = 10 * 365 * 86400  # seconds; omit -t for no limit at all
MAX_TIMESTAMP = 253402300799.0  # 9999-12-31T23:59:59Z: the latest time a date can say
MAX_GPUS = 1024
MAX_CPUS = 1 << 16  # --cpus-per-task
MAX_HOST_MEM = 1 << 50  # bytes of --host-mem (a pebibyte)
MAX_RETRIES = 100  # --retries
MAX_SHOWN_JOBS = 100  # tasks of an array 'gq show ARRAY' details (it says how many more)

# Client and daemon connection
CONNECTION_IDLE = 10.0  # a client that sends nothing for this long is dropped
CLIENT_TIMEOUT = 120.0  # how long a client waits for its answer
DAEMON_START_TIMEOUT = 30.0  # a personal daemon started on demand must answer within this
DAEMON_WAIT = 15.0  # how long a client waits for a system daemon that is restarting
LISTEN_BACKLOG = 512
ALREADY_RUNNING_EXIT = 3  # a daemon that finds another one holding the home exits so
OPEN_AS_OWNER_TIMEOUT = 5.0  # a file opened with a user's rights must open within this

# Execution host
MAX_FRAME = 1 << 20  # bytes in one message between daemon, host and worker (both ends)
MAX_SHARED_USERS = 4096  # users one fair-share message to a host names at most
# Fair share: a user's lane time counts half as much after this many seconds (as Slurm's
# PriorityDecayHalfLife; the daemon's --fair-half-life, "never" for no decay).
FAIR_HALF_LIFE = 86400.0
PROGRESS_PERIOD = 1.0  # the host reports progress to the daemon this often
# A job whose gap between release and next acquire is this short is in a tight loop: when
# the policy prefers it, the lane waits for it rather than letting a less preferred job in
# for a whole iteration (anticipatory scheduling). Real idle gaps are longer and are filled.
ANTICIPATION_LIMIT = 0.002
HOUSEKEEPING_PERIOD = 0.01  # reap, kill deadlines, lanes a policy keeps idle
# A bounded hold: a job goes on holding its lane at most this many seconds while another job
# waits that the policy would grant; then its processes are frozen inside their iteration
# and the lane is the next job's (gq policy set --max-hold changes it live). A training
# iteration never meets it; an iteration that never ends, or a long evaluation in one call,
# runs sliced. Between MIN_MAX_HOLD and MAX_MAX_HOLD.
MAX_HOLD = 2.0
MIN_MAX_HOLD = 0.05
MAX_MAX_HOLD = 86400.0
# A held lane others wait for is asked this often whether the policy now prefers one of
# them (fair's does once the holder's attained time passes theirs): its bound starts then.
CONTENTION_POLL = 0.05
# Under a policy that alternates (fair), a holder whose gaps no other iteration could fill
# keeps its lease beside the jobs it alternates with for this much lane time (asked again
# at the next poll: up to twice it), rather than a switch through the host at every
# boundary (gq.exec.lane.rule.sliced).
LEASE_SLICE = 0.05
# A job leased its lane alone keeps this many iterations' work queued on its device besides
# the one it queues (gq.exec.lane.device_sync): the device stays busy while the CPU queues,
# and a job that comes waits for that much of the holder's tail, not a thousand kernels.
LEASE_AHEAD = 1
# Where no cgroup holds a job's --host-mem (no memory controller passed on to it, --cgroup
# off), what its processes hold is read this often (Slurm's OverMemoryKill polls), or as soon
# after as the last readings are in (gq.exec.host.memory_watch).
HOST_MEMORY_WATCH = 1.0
USAGE_PROCESSES = 1024  # gq show sums the resident sizes of this many processes a request
# What a host reads of one worker per turn of its loop: an honest worker has a message or
# two waiting; one that floods its socket gets this much decoded per turn, as every other
# worker does, not the 64 KiB (about 10 ms of decoding) that would delay their grants.
WORKER_READ = 2048
# How a suspended job's device memory moves to host memory (gq.exec.host.checkpoint): the
# driver's checkpoint API on a GPU (auto), never (off), or a stand-in for tests (fake).
CHECKPOINT_KINDS = ("auto", "off", "fake")
CGROUP = "auto"  # auto | v2 | v1 | off: where each job's processes are kept
CGROUP_KILL_TIMEOUT = 5.0  # a job's cgroup must be empty this long after its kill
# Tasks (processes and threads) one job may have at once: its cgroup's pids.max (the
# daemon's --max-pids), so that a fork bomb's forks fail (EAGAIN) in its own job alone. A
# PyTorch job runs a thread per core and a few per DataLoader worker: hundreds on a big node.
MAX_PIDS = 4096
MAX_PIDS_CEILING = 1 << 22  # the kernel's PID_MAX_LIMIT: no pids.max means more
# All of one gq instance's jobs together may hold this share of the node's tasks (the lower
# of kernel.pid_max and kernel.threads-max; their base cgroup's pids.max): the rest are for
# the node itself (logins, the daemon and hosts, root), however many jobs fork to the limit.
NODE_PIDS_SHARE = 0.75
# A started interactive job's terminal waits this long for its gq (gq run --pty) to take it;
# untaken (that gq died while the job was pending), the job is hung up (--attach-wait).
ATTACH_WAIT = 60.0
MAX_ATTACH_WAIT = 3600.0
# What a Jupyter kernel's first cell reads of the note its launcher left on why it waited.
KERNEL_NOTE_BYTES = 1024

# Worker
MEMORY_SAMPLE_PERIOD = 0.05  # memory figures at most this often: cheap releases
PAGE_UNREADABLE_SECONDS = 2.0  # a worker's page half-written this long: it broke the protocol
# A lease asked back inside an iteration: its lock is tried this often until it comes free
# (the worker's Done usually comes first), more rarely as the iteration goes on.
RECALL_POLL = 0.002
RECALL_POLL_MAX = 0.05

# Memory safety
# One process's CUDA context once cuBLAS is loaded, beyond what PyTorch's allocator reserves:
# NVML counts it, the allocator does not (676 MiB on an H200 with PyTorch 2.11, CUDA 13).
CUDA_CONTEXT = 768 << 20
PROBE_MEMORY = 1 << 30  # bytes a job that declares no memory needs free to start (--probe-mem)
PROBE_ITERATIONS = 3  # ... measured over this many iterations, its lane taken by it meanwhile
PROBE_SECONDS = 5.0  # ... or this long after its first iteration began, for one that runs fewer
# ... or this long after its start, for one that has begun none (--probe-wait): a CUDA job's
# imports, CUDA's start and a model's loading took 7 to 11 s on a 16-core H200 node when
# several jobs started at once, and more where a checkpoint is read.
PROBE_IDLE_SECONDS = 30.0
MAX_PROBE_WAIT = 3600.0  # the longest --probe-wait: a lane closed to others that long
MEMORY_MARGIN = 0.1  # a probed job's figure: its measured peak and this share more
# MEM! only past a job's figure by more than this: the most PyTorch's caching allocator
# reserves beyond what a tensor asks for (one of 1 to 10 MiB gets a 20 MiB segment,
# kLargeBuffer; others 2 MiB blocks), so a job that declared what its tensors take is
# measured up to about this much over it.
MEM_OVER_SLACK = 20 << 20
OOM_REQUEUES = 3  # runs a job may lose to out-of-memory, without --retries, before it fails
OOM_GROWTH = 1.5  # a figure is raised this much when the job did not say what it asked for

# Device sampling, and the thermal and power guard
SAMPLE_PERIOD = 1.0  # read every device this often
MPS_CHECK_PERIOD = 30.0  # ask each MPS control daemon this often whether it still answers
TEMP_HYSTERESIS = 5.0  # a device held for heat admits again this many degrees under --max-temp
POWER_HYSTERESIS = 0.1  # ... held for power, once this share under --max-power

# The descriptors a job's process starts with, besides 0-2: its script's snapshot (read
# only), and a Python job's socket to its host and page shared with it (gq.exec.lane.lease);
# an interactive job's terminal arrives as TERMINAL_FD and becomes its 0-2.
SCRIPT_FD, WORKER_FD, PAGE_FD, TERMINAL_FD = 3, 4, 5, 6
SCRIPT_PATH = f"/dev/fd/{SCRIPT_FD}"
