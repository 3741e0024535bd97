"""Where iterations begin and end, for the loop shapes people write (gq.exec.job.boundaries)."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest

from gq.exec.job.boundaries import Boundary, LoopShape
from gq.exec.job.session import INFER, MANUAL, TRAIN

MODEL, LOSS, D, G, OPT, OPT_D, OPT_G = "model", "loss", "D", "G", "opt", "optD", "optG"


def _counts(events: list[Boundary]) -> dict[str | None, int]:
    found: dict[str | None, int] = {}
    for boundary in events:
        if boundary.count is not None:
            found[boundary.count] = found.get(boundary.count, 0) + 1
    return found


def _releases(events: list[Boundary]) -> int:
    return sum(boundary.release for boundary in events)


def test_one_optimizer_one_iteration_a_step():
    shape, seen = LoopShape(), []
    for _ in range(10):
        seen += [
            shape.forward_begins(MODEL, True),
            shape.forward_ends(True, True),
            shape.forward_begins(LOSS, False),
            shape.forward_ends(False, True),
        ]
        shape.backward()
        seen.append(shape.optimizer_steps(OPT))
    seen.append(shape.script_ends())
    assert _counts(seen) == {TRAIN: 10} and _releases(seen) == 10


def test_two_optimizers_a_step_are_one_iteration_once_the_cycle_is_known():
    """dcgan: D's forward twice, its step, then G through D, G's step."""
    shape, seen = LoopShape(), []
    per_iteration = []
    for _ in range(25):
        before = len(seen)
        seen += [shape.forward_begins(D, True), shape.forward_ends(True, True)]
        shape.backward()
        seen += [
            shape.forward_begins(G, True),
            shape.forward_ends(True, True),
            shape.forward_begins(D, True),
            shape.forward_ends(True, True),
        ]
        shape.backward()
        seen.append(shape.optimizer_steps(OPT_D))
        seen += [shape.forward_begins(D, True), shape.forward_ends(True, True)]
        shape.backward()
        seen.append(shape.optimizer_steps(OPT_G))
        per_iteration.append(_releases(seen[before:]))
    assert _counts(seen)[TRAIN] == 25
    # The first iteration: before any step, D's second forward follows a backward (a
    # hand-written step, as far as anyone can tell), and both steps release; from the
    # second, once D has stepped again, only G's step does.
    assert per_iteration[0] == 3 and per_iteration[1] == 1 and set(per_iteration[2:]) == {1}


def test_weights_updated_by_hand_end_a_step_at_the_models_next_call():
    """word_language_model: no optimizer; 40 training batches, then 10 evaluation batches
    with a loss module under no_grad."""
    shape, seen = LoopShape(), []
    for _ in range(40):
        seen += [
            shape.forward_begins(MODEL, True),
            shape.forward_ends(True, True),
            shape.forward_begins(LOSS, False),
            shape.forward_ends(False, True),
        ]
        shape.backward()
    evaluation = []
    for _ in range(10):
        evaluation += [
            shape.forward_begins(MODEL, True),
            shape.forward_ends(True, False),
            shape.forward_begins(LOSS, False),
            shape.forward_ends(False, False),
        ]
    seen += evaluation + [shape.script_ends()]
    # 39 steps end at the next training call, the 40th at the first evaluation call.
    assert _counts(seen) == {MANUAL: 40, INFER: 10}
    assert evaluation[0] == Boundary(count=MANUAL, release=True)


def test_the_last_hand_written_step_ends_with_the_script():
    shape = LoopShape()
    for _ in range(3):
        shape.forward_begins(MODEL, True)
        shape.backward()
    assert shape.script_ends() == Boundary(count=MANUAL, release=True)
    assert shape.script_ends() == Boundary()


def test_a_forward_after_backward_of_another_module_is_no_boundary():
    """The iteration's model is its first module with parameters; a parameterless module or
    another model called after the backward is not its next call."""
    shape = LoopShape()
    shape.forward_begins(MODEL, True)
    shape.backward()
    assert shape.forward_begins(LOSS, False) == Boundary()
    assert shape.forward_begins(G, True) == Boundary()
    assert shape.forward_begins(MODEL, True) == Boundary(count=MANUAL, release=True)


def test_evaluation_counts_modules_with_parameters_and_releases_at_every_end():
    shape = LoopShape()
    assert shape.forward_ends(True, False) == Boundary(count=INFER, release=True)
    assert shape.forward_ends(False, False) == Boundary(release=True)
    assert shape.forward_ends(True, True) == Boundary()


def test_no_backward_no_optimizer_no_step():
    """Feature extraction with grad enabled: no training step to count."""
    shape, seen = LoopShape(), []
    for _ in range(20):
        seen += [shape.forward_begins(MODEL, True), shape.forward_ends(True, True)]
    seen.append(shape.script_ends())
    assert _counts(seen) == {} and _releases(seen) == 0


def test_once_an_optimizer_steps_backward_and_forward_are_its_business():
    """Gradient accumulation: two backwards a step; the optimizer's steps count."""
    shape, seen = LoopShape(), []
    for micro in range(20):
        seen.append(shape.forward_begins(MODEL, True))
        shape.backward()
        if micro % 2 == 1:
            seen.append(shape.optimizer_steps(OPT))
    seen.append(shape.script_ends())
    assert _counts(seen)[TRAIN] == 10
    assert _counts(seen).get(MANUAL, 0) == 1  # micro-batch 2, before the first step


def test_the_hooks_never_fail_a_module_that_overrides_parameters():
    """A module whose parameters() returns a list (some research code does) failed its own
    forward call under gq: the hooks asked it for an iterator."""
    import torch

    from gq.exec.job import outermost_calls

    class ListParameters(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 2)

        def parameters(self, recurse=True):
            return list(super().parameters(recurse))

        def forward(self, x):
            return self.layer(x)

    class Session:
        def __init__(self):
            self.calls = []

        def acquire(self):
            self.calls.append("acquire")

        def release(self):
            self.calls.append("release")

        def count_step(self, kind):
            self.calls.append(kind)

    session = Session()
    boundaries = outermost_calls.Boundaries(session, torch)
    module = ListParameters()
    boundaries.enter(module)
    boundaries.leave()
    with torch.no_grad():
        boundaries.enter(module)
        boundaries.leave()
    assert boundaries._has_parameters(module)
    assert boundaries._has_parameters(torch.nn.ReLU()) is False
    assert session.calls == ["acquire", "acquire", INFER, "release"]


def test_a_module_found_with_parameters_is_not_asked_again_until_it_is_collected():
    """Asking a model for a parameter costs every iteration microseconds: a yes is kept, for
    that module only while it lives (its id may be another module's next); a no is asked
    again, since a model may build its layers in its first call."""
    import torch

    from gq.exec.job import outermost_calls

    boundaries = outermost_calls.Boundaries(object(), torch)
    lazy = torch.nn.Module()
    assert boundaries._has_parameters(lazy) is False
    lazy.layer = torch.nn.Linear(2, 2)  # built in its first call
    assert boundaries._has_parameters(lazy) is True
    assert id(lazy) in boundaries.with_parameters
    del lazy
    gc.collect()
    assert not boundaries.with_parameters


BACKWARD_ONCE_AN_OPTIMIZER_STEPS = """
import sys
import torch
from gq.exec.job import hooks
from gq.exec.job import import_watch

class Session:
    def acquire(self): pass
    def release(self): pass
    def count_step(self, kind): pass

script_backward = torch.autograd.backward
hooks.install(Session(), torch)
assert torch.autograd.backward is not script_backward  # watched: a backward may end a step
if sys.argv[1] == "wrapped":  # another library wraps it after gq
    theirs = torch.autograd.backward
    torch.autograd.backward = lambda *args, **kwargs: theirs(*args, **kwargs)
    wrapper = torch.autograd.backward
model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    model(torch.ones(2)).sum().backward()
    optimizer.step()
if sys.argv[1] == "wrapped":
    assert torch.autograd.backward is wrapper
else:
    assert torch.autograd.backward is script_backward
print("ok")
"""


@pytest.mark.parametrize("case", ["plain", "wrapped"])
def test_backward_is_the_scripts_own_again_once_an_optimizer_steps(case, tmp_path):
    """Backwards decide nothing once an optimizer counts the iterations, and gq's wrapper
    cost every step a Python call: it is taken off then, unless a wrapper came on top of it
    (which would lose its own)."""
    script = tmp_path / "backward.py"
    script.write_text(BACKWARD_ONCE_AN_OPTIMIZER_STEPS)
    done = subprocess.run(
        [sys.executable, str(script), case], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


HOOKS_AT_WORK = """
import sys
import threading
import torch
import torch.nn.modules.module as module_hooks
from gq.exec.job import hooks
from gq.exec.job import import_watch

class Session:
    def __init__(self): self.calls, self.blocked = [], None
    def acquire(self):
        self.calls.append("acquire")
        if self.blocked is not None:  # waits for the lane
            self.blocked.wait()
    def release(self): self.calls.append("release")
    def count_step(self, kind): self.calls.append(kind)

session = Session()
hooks.install(session, torch)
# no global module hooks: they take every module call off torch's fast path
assert not module_hooks._global_forward_pre_hooks and not module_hooks._global_forward_hooks

def said(case):
    print(case, " ".join(session.calls))
    session.calls.clear()

class Step(torch.nn.Module):  # a whole training step in a module's forward
    def __init__(self):
        super().__init__()
        self.model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU(),
                                         torch.nn.Linear(2, 1))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
    def forward(self, x):
        self.optimizer.zero_grad()
        self.model(x).sum().backward()
        self.optimizer.step()
        return x

step = Step()
for _ in range(2):
    step(torch.ones(2))
said("step-inside")

class Raises(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 2)
    def forward(self, x):
        return torch.nn.Sequential(torch.nn.ReLU(), Fails())(self.layer(x))

class Fails(torch.nn.Module):
    def forward(self, x):
        raise ValueError("bad batch")

with torch.no_grad():
    for _ in range(2):
        try:
            Raises()(torch.ones(2))
        except ValueError:
            pass
said("raising")

entered, leave = threading.Event(), threading.Event()
class Waits(torch.nn.Module):
    def forward(self, x):
        entered.set()
        leave.wait()
        return x

other = threading.Thread(target=lambda: Waits()(torch.ones(2)))
other.start()
entered.wait()
step.optimizer.step()  # an iteration ends while the other thread is inside a call
said("while-inside")
leave.set()
other.join()
said("left")

# An iteration ends while another thread is inside a call, and the next one's forward
# begins before that thread leaves: the lane is wanted again, and kept until its step.
entered.clear(); leave.clear()
other = threading.Thread(target=lambda: Waits()(torch.ones(2)))
other.start()
entered.wait()
step.optimizer.step()
step.model(torch.ones(2)).sum().backward()
leave.set()
other.join()
step.optimizer.step()
said("wanted-again")

class Keyword(torch.nn.Module):
    def forward(self, x, module=None):
        return x if module is None else module(x)
Keyword()(torch.ones(2), module=torch.nn.ReLU())
said("keyword")

# A child forked while another thread waits for the lane (holding the hooks' lock) runs its
# own module calls: torch's alone.
import os, time
session.blocked = threading.Event()
waiting = threading.Thread(target=lambda: Waits()(torch.ones(2)))
leave.set()
waiting.start()
while "acquire" not in session.calls:
    time.sleep(0.01)
child = os.fork()
if child == 0:
    torch.nn.Linear(2, 1)(torch.ones(2))
    torch.optim.SGD(step.model.parameters(), lr=0.1).step()
    os._exit(0)
deadline = time.monotonic() + 30
while os.waitpid(child, os.WNOHANG) == (0, 0) and time.monotonic() < deadline:
    time.sleep(0.01)
if time.monotonic() >= deadline:
    os.kill(child, 9)
    print("fork hung")
else:
    print("fork ran")
session.blocked.set()
waiting.join()
session.blocked = None
session.calls.clear()

# Each compiled module compiled as its own forward, on its own budget of recompiles (ten
# models, each with a forward of its own: not one cache of eight for all).
graphs = []
def backend(graph, inputs):
    graphs.append(graph)
    return graph.forward
for number in range(10):
    source = f"def forward(self, x):\\n    return self.layer(x) * {number + 1}\\n"
    space = {}
    exec(compile(source, f"model{number}.py", "exec"), space)
    model = type(f"Model{number}", (torch.nn.Module,), {"forward": space["forward"]})()
    model.layer = torch.nn.Linear(2, 2)
    with torch.no_grad():
        torch.compile(model, backend=backend)(torch.ones(2))
print("compiled", len(graphs))
"""


def test_the_hooks_keep_torch_s_fast_path_and_release_once_every_thread_has_left(tmp_path):
    """The hooks wrap Module.__call__ and register no global module hooks (those cost every
    nested module call about 2 us). An iteration that ends while a thread is inside a
    module call (an optimizer stepping inside a module's forward; another thread's step)
    releases the lane as the last call leaves (it was lost, and the job held the lane for
    good), unless the next iteration's forward has begun. A call that raises deep inside
    still leaves, nested calls acquire nothing, a forward may take a keyword named
    ``module``, a child forked while a thread waits for the lane does not wait with it, and
    torch.compile still compiles each module on its own."""
    script = tmp_path / "at_work.py"
    script.write_text(HOOKS_AT_WORK)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    said = dict(
        line.split(" ", 1) if " " in line else (line, "") for line in done.stdout.splitlines()
    )
    assert said == {
        "step-inside": f"acquire {TRAIN} release acquire {TRAIN} release",
        "raising": f"acquire {INFER} release acquire {INFER} release",
        "while-inside": f"acquire {TRAIN}",
        "left": "release",
        "wanted-again": f"acquire {TRAIN} acquire {TRAIN} release",
        "keyword": "acquire",
        "fork": "ran",
        "compiled": "10",
    }, done.stdout


AFTER_IMPORT = """
import importlib, importlib.util, sys
sys.dont_write_bytecode = True
here = sys.argv[1]
sys.path.insert(0, here)
from gq.exec.job import hooks
from gq.exec.job import import_watch

class Session:
    def acquire(self): pass
    def release(self): pass
    def count_step(self, kind): pass

seen = []
import_watch.after_import("watched", lambda module: seen.append(module.__name__))
with open(here + "/watched.py", "w") as source:
    source.write("raise RuntimeError('half-built')")
assert importlib.util.find_spec("watched") is not None  # asked whether it is there
try:
    import watched
except RuntimeError:
    pass
with open(here + "/watched.py", "w") as source:
    source.write("VALUE = 1")
importlib.invalidate_caches()
import watched
importlib.reload(watched)
print("watched", seen)

hooks.install_when_imported(Session())
assert importlib.util.find_spec("torch") is not None  # as libraries ask, before the script's import
import torch
print("wrapped", hasattr(torch.nn.Module.__call__, "__wrapped__"))
"""


def test_the_hooks_are_installed_however_often_torch_is_looked_for_first(tmp_path):
    """Libraries ask whether torch is there (importlib.util.find_spec) before the script
    imports it: the watcher took itself off at the first question, and the script ran with
    no hooks, its iterations outside any grant. It now runs its action once, after the first
    import that succeeds (not after a probe, nor one that failed, nor at a reload)."""
    script = tmp_path / "after_import.py"
    script.write_text(AFTER_IMPORT)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["watched ['watched']", "wrapped True"], done.stdout


# A session that notes what the hooks ask of it, and holds the lane as a worker's does.
RECORDING = """
import torch
from gq.exec.job import hooks
from gq.exec.job import import_watch

class Session:
    def __init__(self): self.calls, self.held = [], False
    def acquire(self):
        if not self.held:
            self.calls.append("acquire")
        self.held = True
    def release(self):
        self.calls.append("release")
        self.held = False
    def count_step(self, kind): self.calls.append(kind)
"""

GRAPH_REPLAYS = (
    RECORDING
    + """
class Graph:  # stands in for torch.cuda.CUDAGraph, which needs a GPU to replay
    def replay(self):
        session.calls.append("replay")

torch.cuda.CUDAGraph = Graph
session = Session()
hooks.install(session, torch)
graph, model = Graph(), torch.nn.Linear(2, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

def said(case):
    print(case, " ".join(session.calls))
    session.calls.clear()

with torch.no_grad():
    graph.replay()  # an inference graph: an iteration of its own
said("inference")
graph.replay()  # forward and backward captured, the optimizer's step eager
optimizer.step()
said("then-a-step")
graph.replay()  # a whole step captured: the next replay ends each
graph.replay()
said("whole-steps")
model(torch.ones(2)).sum().backward()  # joins the last replay's iteration
graph.replay()  # between a forward and its optimizer step: inside that iteration
optimizer.step()
said("inside")

class Refused(Exception):
    pass

def refuse():
    raise Refused()

session.acquire, held = refuse, session.held
session.release()
try:
    graph.replay()  # the grant fails (the host gone, an interrupt): counted out again
except Refused:
    pass
session.acquire = Session.acquire.__get__(session)
model(torch.ones(2)).sum().backward()
optimizer.step()
said("after-a-failed-grant")
"""
)


def test_a_cuda_graph_replayed_outside_any_iteration_is_granted_the_lane(tmp_path):
    """A replay calls no module: without its own grant it would run on the device beside
    the lane's holder."""
    script = tmp_path / "replays.py"
    script.write_text(GRAPH_REPLAYS)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "inference acquire replay release",
        "then-a-step acquire replay train release",
        "whole-steps acquire replay release acquire replay",
        "inside replay train release",
        "after-a-failed-grant release acquire train release",
    ], done.stdout


SKIPPED_STEPS = (
    RECORDING
    + """
session = Session()
hooks.install(session, torch)
model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cpu")
for scale in (float("inf"), 1.0):  # the first step is skipped: infinite gradients
    optimizer.zero_grad()
    loss = model(torch.ones(2)).sum() * scale
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    print(" ".join(session.calls)); session.calls.clear()
"""
)


def test_a_step_a_grad_scaler_skips_still_ends_its_iteration(tmp_path):
    """fp16 training skips its first steps (infinite gradients): no optimizer step ends
    those iterations, and the lane was held into the next one."""
    script = tmp_path / "skipped.py"
    script.write_text(SKIPPED_STEPS)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    skipped, stepped = done.stdout.splitlines()
    assert skipped == "acquire release"  # ended at the scaler's update, counted nothing
    # (until an optimizer has stepped, a backward then a model call looks like a step by
    # hand: counted as one, then the optimizer's steps count)
    assert stepped.endswith("acquire train release"), stepped


SCALED_GAN = (
    SKIPPED_STEPS[: SKIPPED_STEPS.index("model = ")]
    + """
scaler = torch.amp.GradScaler("cpu")
d, g = torch.nn.Linear(2, 1), torch.nn.Linear(2, 1)  # one scaler, updated after each step
od, og = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (d, g))
for _ in range(3):
    for model, optimizer in ((d, od), (g, og)):
        optimizer.zero_grad()
        scaler.scale(model(torch.ones(2)).sum()).backward()
        scaler.step(optimizer)
        scaler.update()
    print(" ".join(session.calls)); session.calls.clear()
"""
)


def test_a_grad_scaler_updated_after_each_of_a_gan_s_steps_ends_no_iteration_early(tmp_path):
    """Once D's then G's step is known as one iteration, the update after D's step ends
    nothing: the lane is held on to G's."""
    script = tmp_path / "gan.py"
    script.write_text(SCALED_GAN)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1:] == ["acquire train release"] * 2, done.stdout


COMPILED_STEPS = (
    RECORDING
    + """
session = Session()
hooks.install(session, torch)
model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

def step(batch):
    model(batch).sum().backward()
    optimizer.step()
    optimizer.zero_grad()

def said(case):
    print(case, " ".join(session.calls))
    session.calls.clear()

for case, compiled in (
        ("positional", torch.compile(step, backend="eager")),
        ("keyword", torch.compile(model=step, backend="eager")),
        ("decorator", torch.compile(backend="eager")(step))):
    compiled(torch.ones(2))
    first = session.calls[:]
    session.calls.clear()
    compiled(torch.ones(2))
    if case == "positional":  # (the others find it compiled: dynamo's cache is the code's)
        let_go = first.index("release")
        print("compiling", first[0], let_go < first.index("train"), first[let_go + 1],
              first[-2:])
    said(case)
with torch.no_grad():  # a compiled evaluation step is a batch
    torch.compile(lambda batch: model(batch), backend="eager")(torch.ones(2))
    session.calls.clear()
    torch.compile(lambda batch: model(batch) * 2, backend="eager")  # compiles nothing yet
said("nothing")

torch.compiler.reset()  # (clears dynamo's callbacks: gq's come back)
torch.compile(lambda batch: model(batch).sum(), backend="eager")(torch.ones(2))
print("after-reset", "release" in session.calls[:-1])
session.calls.clear()

# Another thread's iteration is open (its forward done, its step to come) while this
# thread compiles: the lane stays held, for that iteration's kernels.
import threading
forward_done, stepped = threading.Event(), threading.Event()
def other():
    model(torch.ones(2)).sum().backward()
    forward_done.set()
    stepped.wait()
    optimizer.step()
thread = threading.Thread(target=other)
thread.start()
forward_done.wait()
session.calls.clear()
with torch.no_grad():
    torch.compile(lambda batch: model(batch) * 3, backend="eager")(torch.ones(2))
print("beside-an-open-iteration", " ".join(session.calls))
stepped.set()
thread.join()
"""
)


def test_a_compiled_function_is_granted_the_lane_and_compiles_without_it(tmp_path):
    """A training step compiled whole calls no module gq sees: its steps ran ungranted.
    Each call of a compiled function now holds the lane, however torch.compile was
    called; and while dynamo compiles (seconds to minutes, the device idle) the lane is
    let go and taken back before the compiled code runs."""
    script = tmp_path / "compiled.py"
    script.write_text(COMPILED_STEPS)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines == [
        # let go while compiling, taken back before the compiled code ran
        f"compiling acquire True acquire ['{TRAIN}', 'release']",
        *(f"{case} acquire {TRAIN} release" for case in ("positional", "keyword", "decorator")),
        "nothing ",
        "after-reset True",
        f"beside-an-open-iteration {INFER} release",  # released at its end only
    ], done.stdout
