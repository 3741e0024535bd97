# gq puts this directory first on the PYTHONPATH of jobs its worker does not run (a shell
# script's Python, the ranks torchrun starts): the job's lowest rank sends the count of its
# first optimizer's steps to the socket the host made for the run (gq.exec.job.rank_progress).
# Then it loads the sitecustomize this one hides, as Python would have. It imports nothing
# of gq (a job's own "gq" stays its own), and nothing here may stop a job.
import os
import sys
import time


def _lowest_rank():
    # torchrun's RANK where set, else srun's SLURM_PROCID (a gq job's processes inherit 0).
    rank = os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))
    return rank.strip() == "0"


# Seconds between two counts sent: the host's socket holds about ten datagrams
# (net.unix.max_dgram_qlen) and is read once a second, so at this pace none is dropped,
# the last one, sent at exit, included.
SEND_EVERY = 0.25


class _StepCounter:
    def __init__(self, sock):
        self.sock = sock
        self.first = None  # id of the optimizer whose steps count (a GAN has two a step)
        self.steps = 0
        self.sent = 0
        self.sent_at = -SEND_EVERY

    def on_step(self, optimizer, _args, _kwargs):
        if self.first is None:
            self.first = id(optimizer)
        if id(optimizer) == self.first:
            self.steps += 1
            if time.monotonic() - self.sent_at >= SEND_EVERY:
                self.send()

    def send(self):
        if self.sock is not None and self.steps > self.sent:
            try:
                self.sock.send(b"%d" % self.steps)  # a few microseconds
                self.sent, self.sent_at = self.steps, time.monotonic()
            except OSError:
                pass

    def forked(self):
        self.sock = None  # a forked child (a DataLoader worker) is not the rank


class _AfterImport:
    # Runs then(module) right after the module is first imported, as gq.exec.job.import_watch.
    def __init__(self, name, then):
        self.name, self.then, self.done = name, then, False

    def find_spec(self, name, path, target=None):
        if name != self.name or self.done:
            return None
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or spec.loader is None:
            return spec
        loader_exec = spec.loader.exec_module
        watcher = self

        def exec_module(module):
            loader_exec(module)
            if module.__name__ == watcher.name and not watcher.done:
                watcher.done = True
                watcher.then(module)

        spec.loader.exec_module = exec_module
        return spec


def _count_steps():
    if sys.version_info[0] < 3:  # Python 2's import system asks finders otherwise
        return
    path = os.environ.get("GQ_PROGRESS_SOCKET")
    if not path or "GQ_WORKER_FD" in os.environ or not _lowest_rank():
        return
    if getattr(sys, "_gq_counts_steps", False):  # two gq sites on the path: one counter
        return
    import socket

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.setblocking(False)
        sock.connect(path)
    except OSError:
        sock.close()
        return
    counter = _StepCounter(sock)
    sys._gq_counts_steps = True

    def hook(_torch):
        try:
            import atexit
            import importlib

            steps = importlib.import_module("torch.optim.optimizer")
            steps.register_optimizer_step_post_hook(counter.on_step)
            atexit.register(counter.send)
            os.register_at_fork(after_in_child=counter.forked)
        except Exception:
            pass  # a torch without global step hooks: no count

    if "torch" in sys.modules:
        hook(sys.modules["torch"])
    else:
        sys.meta_path.insert(0, _AfterImport("torch", hook))


def _load_the_hidden_one():
    # The next sitecustomize on sys.path after this one's own entry, as the module
    # "sitecustomize" from then on; its errors are shown as site.py shows them.
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    entries = [os.path.abspath(p or os.curdir) for p in sys.path]
    if here not in entries:
        return
    rest = sys.path[entries.index(here) + 1 :]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.stderr.write(
            "Error in sitecustomize; set PYTHONVERBOSE for traceback:\n%s: %s\n"
            % (exc.__class__.__name__, exc)
        )


try:
    _count_steps()
except Exception:
    pass
try:
    _load_the_hidden_one()
except Exception:
    pass
