"""Every tunable of gq in one place (as rq keeps ``rq/defaults.py``)."""

# Daemon
POLL_PERIOD = 1.0  # rescan the queue this often even when no request changed it
FLUSH_PERIOD = 1.0  # write jobs' progress to the queue this often
HOST_RESTART_DELAY = 1.0  # wait before replacing an execution host that died
LANES = 1  # iterations that may run at once on one device
MAX_RESIDENT = 4  # jobs kept resident on one device
KILL_WAIT = 10.0  # seconds between SIGTERM and SIGKILL
STOP_GRACE = 5.0  # beyond the kill wait, how long a stopping daemon waits for its jobs
PRIORITY_CAP = 0  # in system mode, the highest --priority a non-operator may ask for

# Client and daemon connection
CONNECTION_IDLE = 10.0  # a client that sends nothing for this long is dropped
CLIENT_TIMEOUT = 120.0  # how long a client waits for its answer
DAEMON_START_TIMEOUT = 30.0  # a personal daemon started on demand must answer within this
DAEMON_WAIT = 15.0  # how long a client waits for a system daemon that is restarting
LISTEN_BACKLOG = 512
ALREADY_RUNNING_EXIT = 3  # a daemon that finds another one holding the home exits so

# Execution host
PROGRESS_PERIOD = 1.0  # the host reports progress to the daemon this often
# A job whose gap between release and next acquire is this short is in a tight loop: when
# the policy prefers it, the lane waits for it rather than letting a less preferred job in
# for a whole iteration (anticipatory scheduling). Real idle gaps are longer and are filled.
ANTICIPATION_LIMIT = 0.002
HOUSEKEEPING_PERIOD = 0.01  # reap, kill deadlines, lanes a policy keeps idle

# Worker
MEMORY_SAMPLE_PERIOD = 0.05  # memory figures at most this often: cheap releases

# Device sampling, and the thermal and power guard
SAMPLE_PERIOD = 1.0  # read every device this often
TEMP_HYSTERESIS = 5.0  # a device held for heat admits again this many degrees under --max-temp
POWER_HYSTERESIS = 0.1  # ... held for power, once this share under --max-power
