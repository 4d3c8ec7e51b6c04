"""Self-checks for the exercise notebooks.

Each ``exN_...`` function takes the student's function, runs it on a ladder of cases (an easy
case first, then the awkward ones: overflow, bf16, padding, interleaved or singleton groups,
positions where every token is certain), and compares the answer with the project's own code
(``otb.py``, ``toy_env.py``) or with exact numbers from autograd. It prints one verdict:

    Exercise 1a (sum_k pi_k^2): CORRECT. ...
    Exercise 1a (sum_k pi_k^2): NOT YET CORRECT
      problem: <which case, what differs, where>
      hint:    <what usually causes it>

and returns True or False. A check never raises, whatever the student's code does (an
exception inside it, or a blank that still returns None, is reported as "not yet correct"),
so a half-finished notebook still runs top to bottom.

Five rules keep the verdicts honest:

* every random draw comes from a ``torch.Generator`` seeded here, never from the global one, so the
  numbers a check prints are the same on every run and every student's screen;
* for marks, grade.py draws those seeds afresh and decides in its own process: the check runs in the
  student's kernel only to hand the student's functions their inputs and save what they return
  (``record``), then again in grade.py, which draws the same inputs, computes the references and reads
  the saved results (``replay``); every check has inputs drawn from a seed, so a table of the fixed
  examples' answers is NOT YET;
* while the student's function runs, the check watches which functions it calls: a call from the
  answer into any function of otb.py, toy_harness.py, check.py, the project's tests (``tests/naive.py``'s
  loops) or its benchmarks is reported as NOT YET, since those compute the answers and the comparison
  would then prove nothing. The rule goes by where a function lives, so a function added there later
  is watched too; the only exceptions are the few helpers the blanks hand to students (``ALLOWED``,
  named with the reason for each);
* an error raised inside the project's code names its file and the student's line that called it;
* a right answer computed in float32 or float64 passes (``_like`` casts it for torch's comparisons, and
  the tolerances allow float32's 24 bits); only Exercise 1a, which is about precision, asks for a dtype.

Every hint a check can print is written ``H("...")``: ``ta_table.py`` reads them all from this file
for the teaching assistants' table, so a hint that is not wrapped is missing from it. The table lists,
next to each hint, the slips of solutions/slips.py that print it; a hint that no slip should reach (the
fallback of a check, for a result none of its named slips explains, and the guards on the project's own
code) carries a comment ``# when: ...`` saying what prints it instead.
"""
import contextlib
import io
import math
import sys
import traceback
from pathlib import Path

import torch

import otb

CORRECT = "CORRECT"
NOT_YET = "NOT YET CORRECT"

# Every graded exercise, by the check function its notebook calls: grade.py titles a check cell that
# printed no verdict (a syntax error above it, a loop that never ends) with the title of its exercise.
TITLES = {
    "ex1a_sum_pi_squared": "Exercise 1a (sum_k pi_k^2 from logits)",
    "ex1b_token_energy": "Exercise 1b (the Logit-Gradient Proxy w_t)",
    "ex2a_sequence_scores": "Exercise 2a (sequence scores R)",
    "ex2b_group_mean": "Exercise 2b (group-mean baseline)",
    "ex2c_rloo": "Exercise 2c (leave-one-out baseline, RLOO)",
    "ex3a_reward_to_go": "Exercise 3a (reward-to-go G_t)",
    "ex3b_realized_energy": "Exercise 3b (realized energy W_t)",
    "ex3c_optimal_token_baseline": "Exercise 3c (the Optimal Token Baseline)",
    "ex3d_leave_one_out": "Exercise 3d (leave-one-out OTB)",
    "ex3e_trains": "Exercise 3e (your OTB trains the model)",
    "ex4a_batch_gradients": "Exercise 4a (one gradient estimate per group)",
    "ex4b_bias_and_variance": "Exercise 4b (bias^2 and variance)",
    "ex4c_measure": "Exercise 4c (measure two estimators)",
    "ex5a_action_index": "Exercise 5a (the action index k_t)",
    "ex5b_compaction": "Exercise 5b (gather the actions, scatter back)",
    "ex5c_action_aligned_otb": "Exercise 5c (OTB aligned by action)",
}

# The check cells of each exercise notebook, in order, as they are handed out: grade.py runs these
# itself (never the notebook's text), and reports a check cell that is missing, edited or placed above
# the answer it checks as NOT YET.
NOTEBOOKS = {
    "01_sum_pi_squared": ["ok_1a = check.ex1a_sum_pi_squared(sum_pi_squared)",
                          "ok_1b = check.ex1b_token_energy(token_energy)"],
    "02_group_baselines": ["ok_2a = check.ex2a_sequence_scores(sequence_scores)",
                           "ok_2b = check.ex2b_group_mean(group_mean_advantages)",
                           "ok_2c = check.ex2c_rloo(rloo_advantages)"],
    "03_optimal_token_baseline": [
        "ok_3a = check.ex3a_reward_to_go(reward_to_go)",
        "ok_3b = check.ex3b_realized_energy(realized_energy)",
        "ok_3c = check.ex3c_optimal_token_baseline(optimal_token_baseline, reward_to_go=reward_to_go,\n"
        "                                         realized_energy=realized_energy)",
        "ok_3d = check.ex3d_leave_one_out(optimal_token_baseline, reward_to_go=reward_to_go,\n"
        "                                 realized_energy=realized_energy)",
        "ok_3e = check.ex3e_trains(optimal_token_baseline)"],
    "04_bias_variance_toy": ["ok_4a = check.ex4a_batch_gradients(batch_gradients, en)",
                             "ok_4b = check.ex4b_bias_and_variance(bias_and_variance)",
                             "ok_4c = check.ex4c_measure(measure, en, batch_gradients=batch_gradients, "
                             "bias_and_variance=bias_and_variance)"],
    "05_align_by_action": ["ok_5a = check.ex5a_action_index(action_index)",
                           "ok_5b = check.ex5b_compaction(to_actions, from_actions)",
                           "ok_5c = check.ex5c_action_aligned_otb(action_aligned_otb)"],
}


def H(text):
    """A hint the checks can print (see the module docstring): returned unchanged."""
    return text


class NotYet(Exception):
    """Raised inside a check to stop at the first problem; turned into the printed verdict."""

    def __init__(self, problem, hint):
        super().__init__(problem)
        self.problem, self.hint = problem, hint


def _verdict(title, body):
    """Run ``body()``; print CORRECT + its summary, or NOT YET CORRECT + problem and hint."""
    try:
        summary = body()
    except NotYet as e:
        print(f"{title}: {NOT_YET}\n  problem: {e.problem}\n  hint:    {e.hint}")
        return False
    except Exception as e:  # a bug in the check itself must still not crash the notebook
        print(f"{title}: {NOT_YET}\n  problem: the check failed unexpectedly ({type(e).__name__}: {e})\n"
              # when: the check itself raised on a result it did not foresee (a fault in check.py, to report)
              f"  hint:    {H('run your function on the example inputs above and look at what it returns')}")
        return False
    print(f"{title}: {CORRECT}. {summary}")
    return True


_PROJECT = Path(otb.__file__).resolve().parent  # the repository root
_LIBRARIES = tuple(str(Path(p).resolve()) for p in {sys.prefix, sys.base_prefix, sys.exec_prefix})


def _is_project(filename):
    """True for a module of this project (otb.py, toy_harness.py, check.py) or of an installed library."""
    path = Path(filename).resolve()
    return str(path).startswith(_LIBRARIES) or path.parent in (_PROJECT, Path(__file__).resolve().parent)


def _where(tb):
    """Where an exception was raised: the file, line and code, and the student's line that led there."""
    frames = traceback.extract_tb(tb)
    last = frames[-1]
    here = f"{Path(last.filename).name}, line {last.lineno}, in {last.name}: {last.line}"
    if not _is_project(last.filename):
        return f"your code, line {last.lineno}: {last.line}"
    yours = [f for f in frames if not _is_project(f.filename)]
    if not yours:
        return here
    return f"raised inside {here}; called from your code, line {yours[-1].lineno}: {yours[-1].line}"


def _helper(filename):
    """True for a module of the project's tests (``tests/naive.py``, not the ``test_*.py`` files) or of
    its benchmarks: they hold loop versions of the estimators, so calling them proves nothing either."""
    path = Path(filename).resolve()
    if path.parent == _PROJECT / "tests":
        return not path.name.startswith(("test_", "conftest"))
    return _PROJECT / "tests" in path.parents or _PROJECT / "benchmarks" in path.parents


_WATCHED = {_PROJECT / "otb.py": "otb", _PROJECT / "toy_harness.py": "toy_harness",
            Path(__file__).resolve(): "check"}  # the modules that compute the answers, by file

# The project functions that an exercise's blanks hand to students (its TODO lines name them): an answer
# may call these, and nothing else of otb.py, toy_harness.py, check.py, tests/ or benchmarks/.
#   otb.group_ids          maps any group ids to 0..n-1: bookkeeping, not the baseline (2b, 2c, 3c-3e);
#   otb.token_energy       w_t, Exercise 1b's answer, which 3b's running sum and 3c-3e build on;
#   otb.optimal_token_baseline  Exercise 3's answer, which 5c runs over actions instead of positions;
#   toy_harness.sample_groups, otb.group_mean, otb.rloo  in 4c: the sampler and the two estimators whose
#                          bias and variance the student measures (with their own 4a and 4b).
ALLOWED = {
    "ex2b_group_mean": ("otb.group_ids",),
    "ex2c_rloo": ("otb.group_ids",),
    "ex3b_realized_energy": ("otb.token_energy",),
    "ex3c_optimal_token_baseline": ("otb.group_ids", "otb.token_energy"),
    "ex3d_leave_one_out": ("otb.group_ids", "otb.token_energy"),
    "ex3e_trains": ("otb.group_ids", "otb.token_energy"),
    "ex4c_measure": ("toy_harness.sample_groups", "otb.group_mean", "otb.rloo"),
    "ex5c_action_aligned_otb": ("otb.optimal_token_baseline",),
}


def _module(name):
    """The watched module named ``name`` ('otb', 'toy_harness' or 'check'), imported on first use."""
    import importlib
    return sys.modules[__name__] if name == "check" else importlib.import_module(name)


class _Watch:
    """Records the first call, made from the student's code, into any function of otb.py, toy_harness.py,
    check.py, the project's tests (``_helper``) or benchmarks, other than the names in ``allowed`` (a
    key of ALLOWED, or a tuple of 'module.function' names), while the block runs.

    The rule is by where a function lives, so a function added to those files later is watched too;
    any function bound in the namespace of otb, toy_harness or check is watched as well, wherever its
    code was written. A profile hook sees every Python call, whatever name the student reached the
    function by (``otb.ESTIMATORS["otb_tir"]``, ``from otb import ...``, a lambda or
    ``functools.partial`` around it). Calls made by the project's own modules (an allowed helper's
    internals, toy_env's ``en.batch``) are not the student's and are not recorded."""

    def __init__(self, allowed=()):
        names = ALLOWED.get(allowed, ()) if isinstance(allowed, str) else tuple(allowed)
        self.allowed = names
        self.allow = set()
        for name in names:
            module, attr = name.split(".")
            fn = getattr(_module(module), attr)
            self.allow.add(id(getattr(fn, "__code__", None)))
        self.bound = {}  # id(code) -> 'module.name' of every plain function in a watched module's namespace
        for module in ("otb", "check", "toy_harness"):
            if module not in sys.modules and module != "check":
                continue
            for attr, fn in vars(_module(module)).items():
                code = getattr(fn, "__code__", None)
                if code is not None and not code.co_filename.startswith(_LIBRARIES):
                    self.bound.setdefault(id(code), f"{module}.{attr}")
        self.files = {}  # file name -> (watched: how to name it, or None; the project's own code), once per file
        self.keep = [self.allow, self.bound]
        self.called = self.helper = self.entry = None

    def _file(self, name):
        if name not in self.files:
            if name.startswith("<"):
                self.files[name] = (None, False)
            else:
                path = Path(name).resolve()
                module = _WATCHED.get(path)
                watched = module or (_helper(name) and str(path.relative_to(_PROJECT)))
                inside = _PROJECT in path.parents and _PROJECT / "notebooks" not in path.parents
                own = bool(watched) or (inside and not path.name.startswith(("test_", "conftest")))
                self.files[name] = (watched, own)
        return self.files[name]

    def _hook(self, frame, event, arg):
        if event != "call" or self.called is not None:
            return
        code = frame.f_code
        if id(code) in self.allow or code is _Watch.__exit__.__code__:  # __exit__: the block has ended
            return
        watched = self.bound.get(id(code)) or self._file(code.co_filename)[0]
        if not watched:
            return
        caller = frame.f_back  # the function the check hands the student's answer to is the student's
        if caller is not None and caller.f_code is not self.entry and self._file(caller.f_code.co_filename)[1]:
            return  # the project calling itself (inside an allowed helper, say)
        if watched in _WATCHED.values():  # a function of otb.py, toy_harness.py or check.py, by file
            self.called = f"{watched}.{code.co_name}"
        elif id(code) in self.bound:
            self.called = watched
        else:  # a helper of the tests or benchmarks
            self.called, self.helper = f"{code.co_name} ({watched})", True

    def __enter__(self):
        self.entry = sys._getframe(1).f_code  # the check's line that calls the answer (a call from it counts)
        self.previous = sys.getprofile()
        sys.setprofile(self._hook)
        return self

    def __exit__(self, *exc):
        sys.setprofile(self.previous)
        return False


def _call(fn, case, *args, allowed=(), **kwargs):
    """Call the student's function; an exception, a None result or a call into the project's code other
    than the helpers ``allowed`` (a key of ALLOWED: the exercise's check) becomes NotYet (see _Watch).
    While grade.py grades, the result is recorded or replayed instead (``_taped``)."""
    return _taped(case, lambda: _answer(fn, case, *args, allowed=allowed, **kwargs))


def _answer(fn, case, *args, allowed=(), **kwargs):
    """_call's work: the student's function called under the watch, its result or the NotYet it earns."""
    try:
        with _Watch(allowed) as watch:
            out = fn(*args, **kwargs)
    except Exception as e:
        last = traceback.extract_tb(e.__traceback__)[-1].filename
        raise NotYet(f"on the case '{case}' your function raised {type(e).__name__}: {e}\n"
                     f"           ({_where(e.__traceback__)})",
                     H("a function you call still returns None: finish the earlier blanks first")
                     if "NoneType" in str(e) else
                     H(f"{Path(last).name} rejected the arguments your line passed it: print them and compare "
                       f"with what that function expects (which mask, which shape)") if _is_project(last) else
                     H("call your function on the example inputs in the notebook and read the traceback"))
    if watch.called:
        what = ("a loop the project's tests (or benchmarks) use to check its code, which computes this answer"
                if watch.helper else "the project's reference code, which computes this answer")
        handed = ", ".join(watch.allowed) or "none of the project's functions"
        raise NotYet(f"on the case '{case}' your function calls {watch.called}, {what}, so the comparison would "
                     f"prove nothing (this exercise hands you {handed})",
                     H("write this step yourself from the formulas above (the helpers the instructions name "
                       "are fine)"))
    if out is None:
        raise NotYet("your function returned None: the blank marked TODO(student) is not filled in yet",
                     H("replace the `return None` line with your code (the markdown above the cell says what "
                       "to compute)"))
    return out


# =====================================================================================
# Grading: inputs drawn at grading time, the verdict decided outside the student's kernel
# =====================================================================================
# In a notebook's own check cells every input comes from a fixed seed, so the examples a check prints are
# the same on every screen. For marks, grade.py draws a seed no notebook can know in advance and runs each
# check twice: once in the student's kernel (``record``), where the check hands its inputs to the student's
# functions and saves only what they return, and once in grade.py's own process (``replay``), where the
# check draws the same inputs, computes its references there and reads the saved results in place of
# calling the student's code. Only the second run's verdict counts, so nothing the kernel patches (torch,
# print, json, this module) reaches the comparison, and a table of the fixed examples' answers fails on
# the new inputs.

_DRAW = None  # the seed grade.py drew, while it grades; None in the notebooks' own check cells
_TAPE = None  # while grade.py grades: the student's results, being recorded (kernel) or replayed (grade.py)


def _seed(seed):
    """The seed a check draws its inputs from: ``seed`` itself in a notebook's check cell (the documented
    examples); mixed with grade.py's seed (0 .. 2**62 - 1) while it grades, by Knuth's 64-bit multiplier
    (odd), so that neighbouring seeds give unrelated inputs and no drawn seed gives the examples' own."""
    return seed if _DRAW is None else ((_DRAW + 1) * 6364136223846793005 + seed) % 2 ** 63


def _rng(seed):
    """A generator for a check's inputs, seeded with ``_seed(seed)``; never the global one."""
    return torch.Generator().manual_seed(_seed(seed))


class _Tape:
    """The student's results in the order the check asked for them: ('out', case, the result as torch.save
    wrote it) or ('notyet', case, problem, hint), the verdict a call earned in the kernel (an exception, a
    call into otb.py, None). Recording when built without ``entries``, else replaying them."""

    def __init__(self, entries=None):
        self.recording, self.entries, self.next = entries is None, list(entries or []), 0
        self.depth = 0  # > 0 inside a recorded call: a call nested in it (3e's estimator) is part of it


def _taped(case, compute):
    """``compute()``, the student's result on the case ``case``, outside grading. While grade.py grades: in
    the kernel, also saved on the tape; in grade.py's process, read from the tape instead of computed."""
    tape = _TAPE
    if tape is None or tape.depth:
        return compute()
    if tape.recording:
        tape.depth += 1
        try:
            out = compute()
        except NotYet as e:
            tape.entries.append(("notyet", case, e.problem, e.hint))
            raise
        finally:
            tape.depth -= 1
        try:
            buf = io.BytesIO()
            torch.save(out, buf)
            tape.entries.append(("out", case, buf.getvalue()))
        except Exception:  # a function, a generator: nothing a check asks for
            tape.entries.append(("out", case, type(out).__name__))
        return out
    if tape.next >= len(tape.entries) or tape.entries[tape.next][1] != case:
        ran = tape.entries[tape.next][1] if tape.next < len(tape.entries) else "none"
        raise NotYet(f"the grader's own run of this check asked for the case '{case}', the run in your notebook "
                     f"for '{ran}': the two runs parted",
                     # when: the kernel's run of a check took another path than grade.py's (a patch in the kernel)
                     H("run the notebook again from the top in a fresh kernel (Run All), then grade it again"))
    entry = tape.entries[tape.next]
    tape.next += 1
    if entry[0] == "notyet":
        raise NotYet(entry[2], entry[3])
    if isinstance(entry[2], str):
        raise NotYet(f"on the case '{case}' your function returned a {entry[2]}, which the grader cannot read back",
                     # when: an answer returned what torch.save cannot write (a lambda, a class of the notebook)
                     H("return what the exercise asks for: a torch.Tensor (a pair of numbers in 4b and 4c)"))
    return _plain(entry[2], case)


def _plain(data, case):
    """A result torch.save wrote in the kernel, read back as plain data (torch.load with weights_only: tensors,
    numbers, numpy arrays, tuples; never code or a class of the notebook's); NotYet if it is anything else."""
    import numpy as np
    core = getattr(np, "_core", None) or np.core  # numpy 2 renamed np.core
    dtypes = [type(np.dtype(t)) for t in ("float64", "float32", "float16", "int64", "int32", "bool")]
    try:
        with torch.serialization.safe_globals([np.dtype, np.ndarray, core.multiarray.scalar,
                                               core.multiarray._reconstruct, *dtypes]):
            return torch.load(io.BytesIO(data), weights_only=True)
    except Exception:
        raise NotYet(f"on the case '{case}' your function returned an object that is not a plain tensor or number "
                     f"(a subclass of torch.Tensor, say), which the grader does not read back",
                     # when: an answer returned what torch.load(weights_only=True) refuses (a subclass of Tensor)
                     H("return what the exercise asks for: a torch.Tensor (a pair of numbers in 4b and 4c)")) from None


def record(check_fn, seed, path, *args, **kwargs):
    """In the student's kernel, as grade.py runs a check cell: ``check_fn(*args, **kwargs)`` on inputs drawn
    from ``seed``, its printed verdict dropped, and the student's results saved to ``path`` (torch.save),
    with the positions and names of the arguments that were None. Returns the kernel's own verdict, which
    does not count."""
    global _DRAW, _TAPE
    _DRAW, _TAPE = seed, _Tape()
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            ok = check_fn(*args, **kwargs)
    finally:
        none = [k for k, a in enumerate(args) if a is None] + [k for k, a in kwargs.items() if a is None]
        torch.save({"entries": _TAPE.entries, "none": none}, path)
        _DRAW = _TAPE = None
    return ok


# The arguments of a check cell that are not the student's answers: grade.py's process builds its own, as
# the notebook's first cells do (notebook 04's toy bandit, with the configuration it states).
def _toy():
    """Notebook 04's toy bandit, ``en``, built as its first cells build it."""
    import toy_env
    return toy_env.enumerate_toy(toy_env.ToyConfig())


BUILT = {"en": _toy}


class Recorded:
    """Stands for a student's function in grade.py's process, where its results come from the tape."""

    def __init__(self, name):
        self.name = name

    def __call__(self, *args, **kwargs):  # a check calls the student's code only through _taped, which replays
        raise RuntimeError(f"{self.name} was called while replaying a check")


def argument(name, built):
    """A check cell's argument ``name`` in grade.py's process: one of BUILT (built once, kept in the dict
    ``built``), or else the student's function, a ``Recorded`` stand-in."""
    if name not in BUILT:
        return Recorded(name)
    if name not in built:
        built[name] = BUILT[name]()
    return built[name]


def replay(name, seed, saved, *args, **kwargs):
    """In grade.py's own process: the check ``name`` (a key of TITLES) called with ``args`` and ``kwargs`` on
    the inputs drawn from ``seed``, its references computed here and the student's results read from
    ``saved`` (the bytes ``record`` wrote) in place of calling the student's functions (``Recorded``
    stand-ins will do); an argument that was None in the kernel is None here too. Returns (ok, what the
    check printed)."""
    global _DRAW, _TAPE
    tape = torch.load(io.BytesIO(saved), weights_only=True)
    args = [None if k in tape["none"] else a for k, a in enumerate(args)]
    kwargs = {k: None if k in tape["none"] else a for k, a in kwargs.items()}
    _DRAW, _TAPE = seed, _Tape(tape["entries"])
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            ok = globals()[name](*args, **kwargs)
    finally:
        _DRAW = _TAPE = None
    return ok is True, out.getvalue()


def _like(got, want):
    """``got`` in ``want``'s float type, for comparing the two: a right answer may be computed in float32 or
    float64, and torch compares two tensors only in one dtype. An integer or bool result is cast too, and
    then differs by its values (an integer tensor truncates what is written into it), not by a crash.
    Anything else is returned unchanged."""
    if isinstance(got, torch.Tensor) and not got.is_complex() and want.is_floating_point():
        return got.to(want.dtype)
    return got


def _show(x):
    return str(x.detach().double().numpy().round(4).tolist()) if x.numel() <= 24 else f"<{tuple(x.shape)} tensor>"


def _shape_hint(got, want):
    """The hint for a result of shape ``got`` where ``want`` is expected: a reduced dimension kept with size
    1 (keepdim=True), a transposed result, or else which dimension was reduced."""
    kept = [j for j in range(len(got)) if got[j] == 1 and got[:j] + got[j + 1:] == want]
    if kept:
        return H(f"you kept a reduced dimension with size 1 (keepdim=True, or an index [:, None]) at dim {kept[0]}: "
                 f"drop it (keepdim=False), the expected shape is {want}")
    if len(got) == 2 and got == want[::-1] and got != want:
        return H(f"your result is transposed: the expected shape {want} has the rows first (drop the .T, or "
                 f"swap the arguments of the reshape)")
    return H("check which dimension you reduce over (dim=-1) and whether you kept or dropped it")


def _factor_hint(got, want, hint, atol, rtol):
    """``hint``, led by what a result that is ``want`` times one number c (c != 1) shows: the opposite sign
    (c = -1, a subtraction the wrong way round) or a constant factor (a mean for a sum, a missing 2, a
    division by n). Only where want has at least two non-zero values, so that c means something."""
    if (want != 0).sum() < 2:
        return hint
    c = float((got * want).sum() / (want * want).sum())  # the least-squares factor of got on want
    if abs(c - 1) < 1e-3 or abs(c) < 1e-6 or not torch.allclose(got, c * want, atol=atol, rtol=rtol):
        return hint
    if abs(c + 1) < 1e-3:
        return H(f"your values have the opposite sign everywhere: a subtraction the wrong way round; {hint}")
    return H(f"every value of yours is {c:.4g} times the expected one, a constant factor (a mean where a sum "
             f"is meant, a factor 2 too many or too few, a division by n or n - 1): {hint}")


def _compare(got, want, case, hint, *, atol=1e-5, rtol=1e-5, dtype=None, shape_hint=None):
    """got must be a tensor with want's shape (and dtype if given) and close values. ``shape_hint``: the
    hint for a result of the wrong shape, if the check knows better than the generic one."""
    if not isinstance(got, torch.Tensor):
        raise NotYet(f"on the case '{case}' your function returned a {type(got).__name__}, not a tensor",
                     H("return a torch.Tensor"))
    if tuple(got.shape) != tuple(want.shape):
        raise NotYet(f"on the case '{case}' your result has shape {tuple(got.shape)}, expected "
                     f"{tuple(want.shape)}", shape_hint or _shape_hint(tuple(got.shape), tuple(want.shape)))
    if dtype is not None and got.dtype != dtype:
        raise NotYet(f"on the case '{case}' your result has dtype {got.dtype}, expected {dtype}", hint)
    got_d, want_d = got.detach().double(), want.detach().double()
    if not torch.isfinite(got_d).all():
        bad = (~torch.isfinite(got_d)).nonzero()[0].tolist()
        raise NotYet(f"on the case '{case}' your result has a non-finite value ({got_d[tuple(bad)].item()}) "
                     f"at index {tuple(bad)}", hint)
    err = (got_d - want_d).abs()
    tol = atol + rtol * want_d.abs()
    if (err > tol).any():
        hint = _factor_hint(got_d, want_d, hint, atol, rtol)
        flat = int((err - tol).flatten().argmax())
        idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), err.shape))
        msg = (f"on the case '{case}' your values differ, worst at index {idx}: yours "
               f"{got_d[idx].item():.6g}, expected {want_d[idx].item():.6g}")
        if got.numel() <= 24:
            msg += f"\n           yours:    {_show(got_d)}\n           expected: {_show(want_d)}"
        raise NotYet(msg, hint)
    return err.max().item() if err.numel() else 0.0


# =====================================================================================
# Random but reproducible inputs shaped like a real batch
# =====================================================================================

def _batch(lengths, T=None, V=11, scale=2.0, seed=0, dense=False, junk=None, certain=False, outcome=None):
    """Right-padded batch: rewards (outcome at the last valid token, or dense), mask, log_probs, sum pi^2.

    ``outcome``: the rows' outcome rewards R (a list), instead of random ones; a first case uses mixed
    values, so that a baseline weighted in the wrong way cannot pass it by luck. Random outcomes are drawn
    again until they hold a 0 and at least two 1s (one 1 for two rows), and dense rewards until no row's
    score is 0: on a row of score 0, or rows all alike, a slip in a sum, a sign or a baseline can give the
    right values, and every draw must tell them apart as the documented examples do."""
    g = _rng(seed)
    B, T = len(lengths), T or max(lengths)
    mask = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).float()  # (B, T)
    logits = scale * torch.randn(B, T, V, generator=g)  # (B, T, V)
    if certain:
        logits[..., 0] += 100.0  # token 0 has probability 1 in float32: w_t = 0 exactly
    probs = logits.softmax(-1).reshape(B * T, V)  # (B*T, V)
    tokens = torch.multinomial(probs, 1, generator=g).reshape(B, T)  # y_t ~ pi, from g only, (B, T)
    log_probs = logits.log_softmax(-1).gather(-1, tokens[..., None])[..., 0] * mask  # (B, T)
    sum_pi_sq = otb.sum_pi_squared(logits) * mask  # (B, T)
    if dense:
        rewards = torch.randn(B, T, generator=g).round(decimals=1) * mask
        while (rewards.sum(-1).abs() < 0.05).any():  # a score of 0
            rewards = torch.randn(B, T, generator=g).round(decimals=1) * mask
    else:
        drawn = torch.randint(0, 2, (B,), generator=g).float()  # R in {0, 1}
        while B > 1 and (drawn.sum() < min(2, B - 1) or drawn.all()):
            drawn = torch.randint(0, 2, (B,), generator=g).float()
        outcome = drawn if outcome is None else torch.tensor(outcome, dtype=torch.float32)
        rewards = torch.zeros(B, T)
        rewards[torch.arange(B), torch.tensor(lengths) - 1] = outcome
    if junk is not None:
        rewards = torch.where(mask.bool(), rewards, junk)  # padding holds junk: only the mask says valid
    return dict(token_rewards=rewards, response_mask=mask, log_probs=log_probs, sum_pi_sq=sum_pi_sq,
                logits=logits, tokens=tokens)


# =====================================================================================
# Exercise 1: sum pi^2 and the Logit-Gradient Proxy
# =====================================================================================

_HALF = (torch.bfloat16, torch.float16)  # 8 and 11 significant bits; float32 has 24


def _dtype_hint(z, got_dtype, want_dtype):
    """The hint for a result of the wrong dtype, naming the input's and the result's."""
    if want_dtype == torch.float64:
        return H("float64 input should stay float64 (upcast half precision to float32, but do not downcast "
                 "float64)")
    if got_dtype == torch.float64:
        return H(f"{z.dtype} logits give a float32 result: upcast with z.float(), not z.double() (float64 is "
                 f"kept for float64 input only)")
    return H(f"compute and return float32 for {z.dtype} input, not {got_dtype}: upcast the logits first "
             f"(z.float()), then logsumexp; a half-precision result keeps 8 (bf16) or 11 (float16) significant "
             f"bits, float32 24")


def _half_precision(got, want, candidates):
    """The half-precision dtype whose rounding explains ``got``: one of ``candidates`` ({dtype: [values the
    right formula gives when computed in that dtype]}) lies much closer to ``got`` than the right answer
    ``want`` does; of two that do (float16's rounding can fall near bf16's on a draw), the closer. None if
    there is none."""
    got_d, want_d = got.detach().double(), want.detach().double()
    off = (got_d - want_d).abs().max().item()

    def nearest(values):  # the distance from got to the closest of a dtype's ways of computing
        distances = [(got_d - value.double()).abs().max().item() for value in values]
        return min((d for d in distances if d == d), default=math.inf)  # d == d: not NaN
    near = {dtype: d for dtype, values in candidates.items() if (d := nearest(values)) <= 0.25 * off}
    return min(near, key=near.get) if near else None


def _precision_hint(dtype, what):
    """The hint for arithmetic done in ``dtype`` (bf16 or float16) instead of float32."""
    if dtype == torch.float16:
        return H(f"float16 is half precision too: compute {what} in float32 (upcast with .float(), not .half()) "
                 f"before any arithmetic; float16 keeps 11 significant bits (10 stored + 1 implicit), float32 24")
    return H(f"compute {what} in float32, not bf16 (upcast with .float() before any arithmetic): bf16 keeps 8 "
             f"significant bits (7 stored + 1 implicit), float32 24")


def _sum_pi_sq_in(z, dtype):
    """sum_k pi_k^2 of z computed in ``dtype``, three ways a student might write it."""
    zz = z.to(dtype)
    return [torch.exp(torch.logsumexp(2 * zz, -1) - 2 * torch.logsumexp(zz, -1)),
            (zz.softmax(-1) ** 2).sum(-1), (zz.softmax(-1).float() ** 2).sum(-1)]


def ex1a_sum_pi_squared(student_fn):
    """student_fn(logits) -> sum_k softmax(logits)_k^2 over the last dim (float32; float64 stays)."""
    g = _rng(1)
    confident = 4.0 * torch.randn(64, 50, generator=g)
    confident[:, 0] += 30.0  # one token takes nearly all the mass
    # Moderately confident rows (pi(y) ~ 0.5-0.97): bf16 rounding anywhere on the way (a bf16 softmax, a
    # bf16 logsumexp, a bf16 sum) moves sum pi^2 by 1e-3 or more here, far above the tolerance. The first
    # two rows are the notebook's own table; the nearly certain rows above hide it (all values ~ 1).
    moderate = torch.cat([torch.tensor([[5.0, 1.0, 0.3, -1.0], [5.0, 2.0, 0.3, -1.0]]),
                          1.5 * torch.randn(6, 4, generator=g) + torch.tensor([3.0, 0.0, 0.0, 0.0])])
    # Both bf16 cases give the same hint: bf16 rounding that shows on the confident rows shows on the
    # moderate rows, which come first, already.
    upcast_first = H("upcast the bf16 logits to float32 *before* any arithmetic (z = logits.float()): a softmax, "
                     "logsumexp or sum done in bf16 and upcast afterwards keeps bf16's rounding (8 significant "
                     "bits, 7 stored + 1 implicit: 0.9375 instead of 0.9432 on the table's first row)")
    cases = [
        ("small float32 logits, shape (3, 5)", torch.randn(3, 5, generator=g),
         H("sum_k pi_k^2 = sum_k exp(2 z_k) / (sum_k exp(z_k))^2 = exp(logsumexp(2z) - 2 logsumexp(z))")),
        ("huge float32 logits (|z| ~ 1000)", 1000.0 * torch.randn(4, 7, generator=g),
         H("exp(1000) overflows to inf; never exponentiate raw logits, work with torch.logsumexp "
           "(which subtracts the max for you)")),
        ("moderately confident bf16 logits (the rows of the table below)", moderate.bfloat16(), upcast_first),
        ("confident bf16 logits", confident.bfloat16(), upcast_first),
        ("float64 logits", torch.randn(5, 9, generator=g, dtype=torch.float64),
         H("float64 input should stay float64 (upcast half precision to float32, but do not downcast "
           "float64)")),
        ("batched logits, shape (2, 3, 4, 6)", torch.randn(2, 3, 4, 6, generator=g),
         H("reduce over the last dimension only (dim=-1), whatever the number of leading dimensions")),
    ]

    def body():
        for case, z, hint in cases:
            want = otb.sum_pi_squared(z)
            atol = 1e-12 if z.dtype == torch.float64 else 1e-6
            # The logsumexp form subtracts two numbers near 2 max|z|: float32 rounds each by about
            # eps * max|z|, which exp turns into a relative error of that size (about 0.07% on the huge
            # case), so a right answer written that way is allowed 4 eps max|z|.
            rtol = max(1e-5, 4 * torch.finfo(want.dtype).eps * z.double().abs().max().item())
            got = _call(student_fn, case, z.clone(), allowed="ex1a_sum_pi_squared")
            if isinstance(got, torch.Tensor) and got.shape == want.shape:
                if got.dtype != want.dtype:
                    raise NotYet(f"on the case '{case}' your result has dtype {got.dtype}, expected {want.dtype}",
                                 _dtype_hint(z, got.dtype, want.dtype))
                zd = z.double()
                slips = {"log sum pi^2 (the exp is missing)": torch.logsumexp(2 * zd, -1) - 2 * torch.logsumexp(zd, -1),
                         "exp(logsumexp(2z) - logsumexp(z)) (the factor 2 in front of logsumexp(z) is missing)":
                             torch.exp(torch.logsumexp(2 * zd, -1) - torch.logsumexp(zd, -1))}
                for what, value in slips.items():
                    if torch.allclose(got.double(), value, rtol=1e-4, atol=1e-5):
                        raise NotYet(f"on the case '{case}' you computed {what}",
                                     H("sum_k pi_k^2 = exp(logsumexp(2z) - 2 logsumexp(z)), over dim=-1"))
                if not torch.allclose(got.double(), want.double(), rtol=rtol, atol=atol):
                    half = _half_precision(got, want, {d: _sum_pi_sq_in(z, d) for d in _HALF if d != z.dtype})
                    if half is not None:  # (bf16 arithmetic on bf16 input: the case's own hint names it)
                        raise NotYet(f"on the case '{case}' your values carry the rounding of {str(half)[6:]} "
                                     f"arithmetic (largest value: yours {got.double().max().item():.6g}, expected "
                                     f"{want.double().max().item():.6g})",
                                     _precision_hint(half, "sum_k pi_k^2"))
            _compare(got, want, case, hint, atol=atol, rtol=rtol, dtype=want.dtype,
                     shape_hint=hint if want.dim() > 1 else None)  # the batched case's hint is about shape
        return ("Matches otb.sum_pi_squared on small, huge, moderately and very confident bf16, float64 and "
                "batched logits.")
    return _verdict(TITLES["ex1a_sum_pi_squared"], body)


def _autograd_token_energy(logits, tokens):
    """||d log softmax(z)_y / dz||^2 per position by autograd: the exact quantity eq. (7) of otb.py claims."""
    z = logits.detach().double().requires_grad_(True)  # (B, T, V)
    lp = z.log_softmax(-1).gather(-1, tokens[..., None])[..., 0]  # (B, T)
    (grad,) = torch.autograd.grad(lp.sum(), z)  # positions do not interact: each gets its own gradient
    return (grad ** 2).sum(-1)  # (B, T)


def ex1b_token_energy(student_fn):
    """student_fn(log_probs, sum_pi_sq) -> w_t = ||e_y - pi||^2, clamped to [0, 2]."""
    b = _batch([6, 6, 6], V=13, seed=2)
    # The first token made the least likely one of its position: pi puts its mass on other tokens, so
    # w_t > 1 there on every draw, and a clamp to [0, 1] shows.
    b["tokens"][0, 0] = b["logits"][0, 0].argmin()
    b["log_probs"][0, 0] = b["logits"][0, 0].log_softmax(-1).min()
    lp, s = b["log_probs"], b["sum_pi_sq"]
    exact = _autograd_token_energy(b["logits"], b["tokens"])
    # A confident token whose log-prob (from a bf16 rollout, say) says pi(y) = 1 while sum pi^2 says
    # 0.999: the formula gives 1 - 2 + 0.999 < 0, impossible for a squared norm.
    lp_c, s_c = torch.tensor([[0.0, -1e-4, -0.5]]), torch.tensor([[0.999, 0.9996, 0.5]])
    expand = H("expand ||e_y - pi||^2 = sum_k (1[k=y] - pi_k)^2 term by term")
    pi = lp.exp()  # pi(y_t), (B, T)
    wrong = {  # the usual slips, recognised so the hint can be specific: {what: (w, hint)}
        "1 - pi(y) + sum pi^2 (the factor 2 is missing)": (1 - pi + s, expand),
        "1 - 2 pi(y) + pi(y)^2 = (1 - pi(y))^2 (you kept only the y-th component)": ((1 - pi) ** 2, expand),
        "(1 - pi(y))^2 + sum pi^2 (pi(y)^2 counted twice)": (
            (1 - pi) ** 2 + s, H("sum_k (1[k=y] - pi_k)^2 = (1 - pi(y))^2 + sum over k != y of pi_k^2: the second "
                                 "sum leaves pi(y)^2 out, so the total is 1 - 2 pi(y) + sum_k pi_k^2")),
        "- 2 pi(y) + sum pi^2 (the 1 is missing)": (
            -2 * pi + s, H("the expansion starts with sum_k 1[k=y]^2 = 1: w_t = 1 - 2 pi(y) + sum_k pi_k^2")),
        "1 - 2 log pi(y) + sum pi^2 (log-prob used as a probability)": (
            1 - 2 * lp + s, H("log_probs holds log pi(y): pi(y) = log_probs.exp()")),
        "1 - 2 exp(-log_probs) + sum pi^2 (exp(-log_probs) = 1 / pi(y), not pi(y))": (
            1 - 2 * (-lp).exp() + s, H("pi(y) = log_probs.exp(), without a minus sign: exp(-log_probs) is 1 / pi(y) "
                                      ">= 1, which makes 1 - 2 pi(y) + sum pi^2 negative (and a clamp to [0, 2] "
                                      "turns it into 0)")),
        "pi(y) from a softmax of the log-probs over the positions of the row": (
            1 - 2 * lp.softmax(-1) + s, H("log_probs holds one log-probability per position, not a row of logits: "
                                          "pi(y_t) = log_probs.exp(), element by element (a softmax over dim=-1 "
                                          "mixes the positions of the row)")),
        "1 - 2 pi(y) + (sum pi^2)^2 (sum pi^2 squared again)": (
            1 - 2 * pi + s ** 2, H("sum_pi_sq already is sum_k pi_k^2 (Exercise 1a): add it as it is")),
        "the norm ||e_y - pi|| (a square root), not its square": (
            (1 - 2 * pi + s).clamp(0, 2).sqrt(), H("w_t is the *squared* norm ||e_y - pi||^2 = 1 - 2 pi(y) + "
                                                   "sum pi^2: no square root")),
        "1 + 2 pi(y) + sum pi^2 (sign of the cross term)": (1 + 2 * pi + s, expand),
        "the energy clamped to [0, 1]": (
            (1 - 2 * pi + s).clamp(0, 1),
            H("w_t can exceed 1 (up to 2, when pi puts its mass on a token that was not sampled): clamp to [0, 2]")),
    }
    right = (1 - 2 * pi + s).clamp(0, 2)
    in_half = {d: [(1 - 2 * lp.to(d).exp() + s.to(d)).clamp(0, 2), (1 - 2 * pi.to(d) + s.to(d)).clamp(0, 2)]
               for d in _HALF}
    same_shape = H("w_t is one number per token: return the same shape as log_probs (no sum or mean over "
                   "positions)")

    def body():
        case = "random tokens, compared with autograd"
        got = _call(student_fn, case, lp.clone(), s.clone(), allowed="ex1b_token_energy")
        if isinstance(got, torch.Tensor) and got.shape == lp.shape:
            if bool((got == 0).all()):  # first: exp(-log_probs) clamped to [0, 2] is 0 everywhere too
                raise NotYet(f"on the case '{case}' your w_t is 0 at every position",
                             H("a w_t of 0 everywhere is a placeholder still returned (torch.zeros_like(log_probs)), "
                               "or the clamp at work: with a value >= 1 in place of pi(y), such as exp(-log_probs) = "
                               "1 / pi(y), 1 - 2 pi(y) + sum pi^2 is below 0 everywhere. pi(y) = log_probs.exp(), "
                               "without a minus sign"))
            for name, (w, slip_hint) in wrong.items():  # with or without the clamp to [0, 2]
                if any(torch.allclose(got.double(), v.double(), atol=1e-5) and
                       not torch.allclose(v.double(), right.double(), atol=1e-5) for v in (w, w.clamp(0, 2))):
                    raise NotYet(f"on the case '{case}' you computed {name}", slip_hint)
            if got.dtype in _HALF:
                raise NotYet(f"on the case '{case}' your result has dtype {got.dtype}, expected {lp.dtype} (the "
                             f"inputs' dtype)", _precision_hint(got.dtype, "w_t"))
            if not torch.allclose(got.double(), right.double(), atol=1e-5):
                half = _half_precision(got, right, in_half)
                if half is not None:
                    raise NotYet(f"on the case '{case}' your values carry the rounding of {str(half)[6:]} arithmetic",
                                 _precision_hint(half, "w_t = 1 - 2 pi(y) + sum pi^2"))
        err = _compare(got, exact, case,
                       # when: a result that none of the slips this check names explains
                       H("d log softmax(z)_y / dz_k = 1[k=y] - pi_k; square and sum over k"),
                       atol=1e-5, shape_hint=same_shape)
        case = "confident tokens where rounding gives 1 - 2 pi(y) + sum pi^2 < 0"
        _compare(_call(student_fn, case, lp_c.clone(), s_c.clone(), allowed="ex1b_token_energy"),
                 otb.token_energy(lp_c, s_c), case,
                 H("a squared norm cannot be negative: clamp the result to [0, 2]"), shape_hint=same_shape)
        return (f"Equals ||d log pi(y)/dz||^2 from autograd (max error {err:.1e}) and clamps like "
                f"otb.token_energy.")
    return _verdict(TITLES["ex1b_token_energy"], body)


# =====================================================================================
# Exercise 2: group baselines
# =====================================================================================

_UNEQUAL_SIZES = H("do not reshape to (n_groups, N): groups can have different sizes")  # a case's and a slip's

_GROUP_CASES = [  # (case, lengths, group_index, batch options, hint; None: the estimator's own first hint)
    ("one group of 4 rows, no padding, rewards 1, 0, 0, 1", [5, 5, 5, 5], [0, 0, 0, 0], {"outcome": [1, 0, 0, 1]},
     None),
    ("right padding with junk (7.0) in the padded rewards", [5, 2, 4, 3], [0, 0, 0, 0],
     {"junk": 7.0, "outcome": [1, 1, 0, 1]},  # non-zero scores: an advantage left unmasked shows on padding
     H("only valid tokens count: multiply the rewards by response_mask before summing, and multiply the "
       "advantage by response_mask so padded positions are exactly 0")),
    ("two interleaved groups with string ids", [4, 4, 4, 4, 4, 4], ["a", "b", "a", "b", "a", "b"],
     {"outcome": [1, 0, 0, 0, 1, 1]},  # group means 2/3 and 1/3: one group's mean over every row is not A = R
     H("group by id, not by position: rows of a group need not be next to each other (otb.group_ids maps "
       "ids to 0..n-1)")),
    ("groups of sizes 3 and 5", [3, 4, 5, 3, 4, 5, 3, 4], [0, 1, 0, 1, 1, 0, 1, 1], {"dense": True},
     _UNEQUAL_SIZES),
    ("a singleton group next to a group of 3", [4, 4, 4, 4], ["solo", "x", "x", "x"], {"dense": True},
     H("a group with one response has nothing to compare with: like otb.py (and verl), use baseline 0 "
       "there, so a singleton keeps its score as its advantage")),
    ("group_index as an integer tensor", [3, 3, 3, 3, 3], torch.tensor([7, 7, 2, 2, 2]), {"dense": True},
     H("group_index may be a tensor; otb.group_ids(group_index, B) handles both lists and tensors")),
]

_FIRST_HINT = {
    "group_mean": H("b_i = the mean score of row i's group, row i included; A = R - b on every valid token"),
    "rloo": H("b_i = the mean score of the *other* rows of i's group, (sum of the group - R_i) / (n - 1); "
              "A = R - b on every valid token"),
}


def _and(items):
    """[3, 5] -> '3 and 5', [1, 2, 4] -> '1, 2 and 4'."""
    return " and ".join(filter(None, [", ".join(map(str, items[:-1])), str(items[-1])]))


def _group_slips(b, gi, name):
    """The advantages that the usual slips in 2b and 2c give, {description: (A (B, T), what, hint)};
    ``name`` ('group_mean' or 'rloo') is the estimator asked for, whose own slips are listed."""
    m = b["response_mask"]
    R = (b["token_rewards"] * m).sum(-1)  # R_i, (B,)
    gid, n_groups = otb.group_ids(gi, len(R))
    sizes = torch.bincount(gid, minlength=n_groups)  # each group's number of rows, (n_groups,)
    size = sizes.float()[gid]  # n, the size of row i's group, (B,)
    total = torch.zeros(n_groups).index_add_(0, gid, R)[gid]  # sum of R over row i's group, (B,)
    square = torch.zeros(n_groups).index_add_(0, gid, R ** 2)[gid]  # sum of R^2 over the group, (B,)
    single = size == 1
    own = total / size if name == "group_mean" else (total - R) / (size - 1).clamp(min=1)  # the right b_i

    def adv(baseline, scores=R, scale=1.0, mask=m):
        return torch.where(single, scores, (scores - baseline) / scale)[:, None] * mask  # (B, T)
    var = (square - total ** 2 / size).clamp(min=0)  # sum of squared deviations over the group, (B,)
    std_n, std_n1 = (var / size).sqrt(), (var / (size - 1).clamp(min=1)).sqrt()  # per row, (B,)
    grpo_hint = H("do not divide by the group's standard deviation: that is GRPO's normalisation, which "
                  "this exercise (like Dr.GRPO) leaves out; A = R - b")
    raw = b["token_rewards"].sum(-1)  # R from every position, padding included, (B,)
    raw_total = torch.zeros(n_groups).index_add_(0, gid, raw)[gid]
    raw_own = raw_total / size if name == "group_mean" else (raw_total - raw) / (size - 1).clamp(min=1)
    last = torch.zeros_like(m)
    last[torch.arange(len(R)), (m.sum(-1) - 1).long()] = 1.0  # the last valid token of each row
    batch_b = R.mean() if name == "group_mean" else (R.sum() - R) / max(len(R) - 1, 1)
    L = m.sum(-1)  # each row's number of valid tokens, (B,)
    LR = torch.zeros(n_groups).index_add_(0, gid, L * R)[gid]  # sum of L_j R_j over row i's group, (B,)
    L_sum = torch.zeros(n_groups).index_add_(0, gid, L)[gid]  # sum of L_j over the group, (B,)
    by_tokens = LR / L_sum if name == "group_mean" else (LR - L * R) / (L_sum - L).clamp(min=1)
    slips = {}
    if len(R) % n_groups == 0 and (sizes != sizes[0]).any():  # the rows sorted by group, cut into equal blocks
        k = len(R) // n_groups  # (on some draws these blocks' means equal the batch's: this slip is told first)
        order = torch.argsort(gid, stable=True)  # (B,)
        block = torch.zeros_like(R)
        block[order] = R[order].reshape(n_groups, k).sum(1).repeat_interleave(k)  # the sum over row i's block, (B,)
        slips["sorted_blocks"] = (
            adv(block / k if name == "group_mean" else (block - R) / (k - 1)),
            f"a baseline over the rows sorted by group and cut into {n_groups} blocks of {k} (a reshape("
            f"n_groups, -1)), but the groups have {_and(sizes.tolist())} rows", _UNEQUAL_SIZES)
    slips.update({
        "group_mean": (adv(total / size), "a baseline that includes the row's own score (the group mean of 2b)",
                       H("leave row i out: b_i = (sum of the group - R_i) / (n - 1), the mean of the others")),
        "rloo": (adv((total - R) / (size - 1).clamp(min=1)),
                 "a leave-one-out baseline (that is RLOO, Exercise 2c)",
                 H("2b's baseline is the mean of the whole group, row i included: b_i = sum of the group / n")),
        "over_n": (adv((total - R) / size), "(sum of the others) / n, the sum of the n - 1 other scores divided "
                   "by n", H("there are n - 1 other rows: divide their sum by n - 1")),
        "grpo_n": (adv(own, scale=std_n + 1e-6), "the advantage divided by the group's standard deviation",
                   grpo_hint),
        "grpo_n1": (adv(own, scale=std_n1 + 1e-6), "the advantage divided by the group's standard deviation",
                    grpo_hint),
        "unmasked_advantage": (adv(own, mask=torch.ones_like(m)), "the right advantage on valid tokens, but "
                               "not 0 on padding", H("multiply the advantage by response_mask, so that padded "
                                                     "positions are exactly 0")),
        "unmasked_rewards": (adv(raw_own, scores=raw), "scores that include the junk in the padded rewards",
                             H("mask the rewards before summing them (token_rewards * response_mask): values at "
                               "padded positions are meaningless")),
        "last_token": (adv(own, mask=last), "the advantage on the last valid token only",
                       H("write the advantage R_i - b_i on *every* valid token of row i (broadcast over t, then "
                         "multiply by response_mask)")),
        "batch": (adv(batch_b), "a baseline over the whole batch, ignoring the groups",
                  H("b_i uses only the rows of row i's own group (same group_index); otb.group_ids maps ids to "
                    "0..n-1")),
        "by_tokens": (adv(by_tokens), "a mean over the group's tokens (each score weighted by its response's "
                      "length), not over its responses",
                      H("the baseline is a mean over the group's *responses*, one score R_j each: a mean over "
                        "valid tokens (sum of R_j m_t divided by the number of valid tokens) weights long "
                        "responses more")),
    })
    if name == "rloo":  # "the others" found by their score, not their row: every equal score left out
        differ = (gid[:, None] == gid[None, :]) & (R[:, None] != R[None, :])  # j in i's group, R_j != R_i, (B, B)
        n_differ = differ.sum(1)  # (B,)
        b_differ = torch.where(n_differ > 0, (differ * R[None, :]).sum(1) / n_differ.clamp(min=1), 0.0)  # (B,)
        slips["equal_scores"] = (
            adv(b_differ), "a baseline that leaves out every row of the group whose score equals R_i, not only "
            "row i", H("leave out row i itself, not the rows whose score equals R_i: b_i = (sum of the group - "
                       "R_i) / (n - 1); find the others by their index (j != i), not by their score (R_j != R_i)"))
    for k in range(2, len(R)):  # groups taken as consecutive blocks of k rows (R.reshape(-1, k))
        if len(R) % k == 0:
            block = R.reshape(-1, k).sum(1).repeat_interleave(k)  # the sum over row i's block, (B,)
            b_k = block / k if name == "group_mean" else (block - R) / (k - 1)
            slips[f"blocks_{k}"] = (
                adv(b_k), f"a baseline over consecutive blocks of {k} rows (a reshape(-1, {k}))",
                H(f"a group is the rows with the same group_index, wherever they stand and however many: "
                  f"reshape(-1, {k}) takes blocks of {k} neighbouring rows, which is right only when the groups "
                  f"happen to be such blocks (use otb.group_ids and a mask per group)"))
    if name == "group_mean":  # one group's baseline written into every row (baseline[:] = ... in the loop)
        for g in range(n_groups):  # (a group mean of 0 written everywhere is the last slip: no baseline)
            if (gid == g).sum() > 1 and R[gid == g].mean().abs() > 1e-6:
                slips[f"overwritten_{g}"] = (
                    (R - R[gid == g].mean())[:, None] * m, "one group's baseline in every row",
                    H("every row got the baseline of one group: in the loop over groups, write only that "
                      "group's rows (baseline[rows] = ...), not baseline[:] = ... or baseline = ..."))
    # Last: where one group's mean is 0, a baseline written over every row looks like no baseline at all.
    slips["no_baseline"] = (R[:, None] * m, "A = R: no baseline subtracted, or one that is 0 in every row",
                            H("subtract the baseline: A = R - b_i, with b_i from the rows of row i's group. If you "
                              "did, it came out 0: a baseline written into an integer tensor (torch.zeros_like(gid) "
                              "is torch.long) truncates the group means; start from torch.zeros_like(R)"))
    return {k: v for k, v in slips.items() if k != name}


def _per_row_hint(got, want):
    """The hint for an advantage of shape (B,) or (B, 1) where (B, T) is expected, or None for any other
    shape: both are one advantage per row that was never written on the row's tokens."""
    if isinstance(got, torch.Tensor) and tuple(got.shape) == tuple(want.shape[:1]):
        return H("you return one advantage per row, shape (B,): write it on every valid token of the row, "
                 "A[:, None] * response_mask, shape (B, T)")
    if isinstance(got, torch.Tensor) and tuple(got.shape) == (want.shape[0], 1) and want.shape[1] != 1:
        return H("your advantage has shape (B, 1), one per row, not yet broadcast over the tokens: multiply it "
                 "by response_mask, A[:, None] * response_mask, shape (B, T)")
    return None


def _check_group_estimator(title, student_fn, reference, name):
    def body():
        for k, (case, lengths, gi, opts, hint) in enumerate(_GROUP_CASES):
            b = _batch(lengths, seed=10 + k, **opts)
            want = reference(b["token_rewards"], b["response_mask"], gi)[0]
            got = _like(_call(student_fn, case, b["token_rewards"].clone(), b["response_mask"].clone(), gi,
                        allowed="ex2b_group_mean" if name == "group_mean" else "ex2c_rloo"), want)
            if isinstance(got, torch.Tensor) and got.shape == want.shape and not torch.allclose(got, want, atol=1e-5):
                if torch.allclose(got, -want, atol=1e-5):
                    raise NotYet(f"on the case '{case}' your advantages have the opposite sign",
                                 H("the advantage is the score minus the baseline: A = R - b, not b - R"))
                found = _group_slips(b, gi, name)
                # a slip whose values are A = R on this draw is told as A = R, the last slip; of two slips
                # with nearly the same values on a draw, the one closest to got is named
                found = {key: v for key, v in found.items() if key == "no_baseline" or not torch.allclose(
                    v[0], found["no_baseline"][0], atol=1e-4, rtol=1e-3)}
                for key, (A, what, slip_hint) in sorted(found.items(), key=lambda kv: (got - kv[1][0]).abs().max()):
                    if torch.allclose(got, A, atol=1e-4, rtol=1e-3):
                        if key == "no_baseline" and k > 0:
                            # A = R after the first case passed: not a missing baseline, rows not found as a group
                            why = ("the elements of a tensor are distinct objects, so set(), dict keys or `in` do "
                                   "not find equal ids") if isinstance(gi, torch.Tensor) else \
                                "rows with the same id were not grouped"
                            raise NotYet(f"on the case '{case}' every row was its own group (A = R): {why}", hint)
                        raise NotYet(f"on the case '{case}' you computed {what}", slip_hint)
            _compare(got, want, case, hint or _FIRST_HINT[name], shape_hint=_per_row_hint(got, want))
        return (f"Matches otb.{name} with padding, interleaved groups, unequal sizes, singletons and "
                f"tensor ids.")
    return _verdict(title, body)


def ex2a_sequence_scores(student_fn):
    """student_fn(token_rewards, response_mask) -> R (B,): sum of valid token rewards."""
    cases = [("outcome reward at the last valid token", _batch([3, 3, 3], seed=3), H("R_i = sum_t r_t m_t")),
             ("right padding with junk (7.0) in the padded rewards", _batch([4, 1, 2], seed=4, junk=7.0),
              H("multiply by response_mask (or use torch.where) before summing: padding holds junk")),
             ("dense token rewards", _batch([4, 4, 2], seed=5, dense=True),
              H("the score is the sum of all valid token rewards, not just the last one"))]

    def body():
        for case, b, hint in cases:
            want = otb.reinforce(b["token_rewards"], b["response_mask"], range(len(b["log_probs"])))[0][:, 0]
            _compare(_call(student_fn, case, b["token_rewards"].clone(), b["response_mask"].clone(),
                           allowed="ex2a_sequence_scores"), want, case, hint)
        return "Matches the score otb.reinforce uses."
    return _verdict(TITLES["ex2a_sequence_scores"], body)


def ex2b_group_mean(student_fn):
    """student_fn(token_rewards, response_mask, group_index) -> advantages (B, T) like otb.group_mean."""
    return _check_group_estimator(TITLES["ex2b_group_mean"], student_fn, otb.group_mean, "group_mean")


def ex2c_rloo(student_fn):
    """student_fn(token_rewards, response_mask, group_index) -> advantages (B, T) like otb.rloo."""
    return _check_group_estimator(TITLES["ex2c_rloo"], student_fn, otb.rloo, "rloo")


# =====================================================================================
# Exercise 3: the Optimal Token Baseline
# =====================================================================================

def _first_slip(got, slips, case):
    """Raise NotYet for the first of ``slips`` ({what: (value, hint)}) that ``got`` equals (on its shape)."""
    if isinstance(got, torch.Tensor):
        for what, (value, hint) in slips.items():
            if got.shape == value.shape and torch.allclose(got.double(), value.double(), atol=1e-5, rtol=1e-5):
                raise NotYet(f"on the case '{case}' you computed {what}", hint)


def ex3a_reward_to_go(student_fn):
    """student_fn(token_rewards, response_mask) -> G (B, T), 0 on padding."""
    cases = [("outcome reward only", _batch([4, 4, 4], seed=20, outcome=[1, 0, 1]),
              H("with a single outcome reward at the last token, G_t = R at every valid position")),
             ("dense token rewards", _batch([5, 5], seed=21, dense=True),
              H("G_t = sum_{u >= t} r_u sums from t to the end: a reversed cumulative sum "
                "(x.flip(-1).cumsum(-1).flip(-1))")),
             ("right padding with junk (7.0) in the padded rewards", _batch([5, 2, 3], seed=22, dense=True,
                                                                           junk=7.0),
              H("mask the rewards before the cumulative sum, and return 0 on padded positions"))]

    def body():
        for case, b, hint in cases:
            want = otb.optimal_token_baseline(b["token_rewards"], b["response_mask"], [0] * len(b["log_probs"]),
                                              b["log_probs"], b["sum_pi_sq"])[1]
            got = _call(student_fn, case, b["token_rewards"].clone(), b["response_mask"].clone(),
                        allowed="ex3a_reward_to_go")
            if isinstance(got, torch.Tensor) and not torch.allclose(got.double(), want.double(), atol=1e-5):
                m = b["response_mask"]
                r = b["token_rewards"] * m  # r_t, (B, T)
                _first_slip(got, {
                    "G_t = sum_{u > t} r_u (the reward at t itself is left out: off by one)": (
                        want - r, H("G_t includes r_t: sum over u >= t, i.e. the reversed cumulative sum itself, "
                                    "not shifted by one position")),
                    "a cumulative sum from the start, sum_{u <= t} r_u": (
                        r.cumsum(-1) * m, H("the reward-to-go sums from t to the *end*: flip, cumsum, flip back")),
                    "the reversed cumulative sum without flipping back": (
                        r.flip(-1).cumsum(-1) * m, H("after r.flip(-1).cumsum(-1), flip the result back with "
                                                     ".flip(-1) so that position t holds sum_{u >= t} r_u")),
                    "a sum that includes the junk in the padded rewards": (
                        b["token_rewards"].flip(-1).cumsum(-1).flip(-1) * m,
                        H("mask the rewards (token_rewards * response_mask) *before* the cumulative sum: the "
                          "padding on the right flows into every earlier G_t")),
                }, case)
            _compare(got, want, case, hint)
        return "Matches the returns of otb.optimal_token_baseline, padding included."
    return _verdict(TITLES["ex3a_reward_to_go"], body)


def ex3b_realized_energy(student_fn):
    """student_fn(log_probs, sum_pi_sq, response_mask) -> W (B, T); compared on valid positions."""
    cases = [("three rows, no padding", _batch([6, 6, 6], seed=23)),
             ("right padding", _batch([6, 2, 4], seed=24))]

    def body():
        for case, b in cases:
            m = b["response_mask"]
            w = _autograd_token_energy(b["logits"], b["tokens"])  # w_t exactly, by autograd
            want = (w * m).cumsum(-1) * m  # W_t on valid positions
            got = _call(student_fn, case, b["log_probs"].clone(), b["sum_pi_sq"].clone(), m.clone(),
                        allowed="ex3b_realized_energy")
            if isinstance(got, torch.Tensor) and got.shape == want.shape:
                got = got * m  # padded positions are not compared
                if not torch.allclose(got.double(), want, atol=1e-4):
                    wm = w * m
                    _first_slip(got, {
                        "w_t itself, not its running sum": (
                            wm, H("W_t = w_0 + ... + w_t accumulates: w.cumsum(-1)")),
                        "a running sum from the end, w_t + ... + w_{L-1}": (
                            wm.flip(-1).cumsum(-1).flip(-1) * m,
                            H("W_t sums the energy *up to* t (the past), a plain cumsum(-1), not the reward-to-go's "
                              "reversed sum")),
                        "a cumulative sum over the rows (dim=0)": (
                            wm.cumsum(0) * m, H("accumulate over positions t (dim=-1), within each row")),
                        "a running sum of (1 - pi(y_t))^2 (sum pi^2 left out)": (
                            ((1 - b["log_probs"].exp()) ** 2 * m).cumsum(-1) * m,
                            H("w_t = 1 - 2 pi(y_t) + sum_k pi_k^2 (otb.token_energy(log_probs, sum_pi_sq))")),
                    }, case)
            _compare(got, want, case, H("W_t = w_0 + ... + w_t: a cumulative sum over positions (dim=-1) of the "
                                        "token energy otb.token_energy(log_probs, sum_pi_sq)"), atol=1e-4)
        return "W_t equals the running sum of squared logit-gradient norms computed by autograd."
    return _verdict(TITLES["ex3b_realized_energy"], body)


_OTB_CASES = [  # (case, lengths, group_index, batch options, hint)
    ("one group of 4 rows, no padding, rewards 1, 0, 1, 0", [5, 5, 5, 5], [0, 0, 0, 0], {"outcome": [1, 0, 1, 0]},
     H("B_t = sum_i G_t W_t / (sum_i W_t + 1e-8) over the rows of the group, one value per position t; "
       "A_t = G_t - B_t")),
    ("rows of different lengths (right padding)", [6, 2, 4, 3], [0, 0, 0, 0], {"dense": True, "junk": 7.0},
     H("only rows still active at t enter B_t: multiply G_t W_t and W_t by response_mask before summing over "
       "the group, and return A_t = 0 on padding")),
    ("two interleaved groups with string ids", [4, 3, 4, 2, 4, 4], ["a", "b", "a", "b", "a", "b"], {},
     H("sum over the rows with the same id (otb.group_ids maps ids to 0..n-1), not over neighbours")),
    ("a singleton group", [4, 3, 4], ["solo", "x", "x"], {"dense": True},
     H("a group with one response gets B_t = 0 (its advantage is its own return)")),
    ("a group whose tokens are all certain (w_t = 0)", [3, 3], [0, 0], {"certain": True},
     H("when sum_i W_t = 0 the eps = 1e-8 in the denominator keeps B_t = 0 / 1e-8 = 0; do not drop it")),
]

_ALONE_HINT = H("with leave-one-out, a row whose group has no other active row at t gets B_t = 0 (a singleton "
                "group, or the tail of the group's longest row): there is nothing to average")
_OTB_LOO_CASES = [(_OTB_CASES[0][:4] + (
    H("B_t^(-i) = (sum_j G_t W_t m_t - G_t^i W_t^i m_t^i) / (sum_j W_t m_t - W_t^i m_t^i + eps): row i's own "
      "term leaves both sums"),))] + _OTB_CASES[1:3] + [
    ("a singleton group", [4, 3, 4], ["solo", "x", "x"], {"dense": True}, _ALONE_HINT),
    ("tail of the longest row (no other row active)", [6, 2, 3], [0, 0, 0], {"dense": True}, _ALONE_HINT),
    ("a group whose tokens are all certain (w_t = 0)", [3, 3, 3], [0, 0, 0], {"certain": True},
     H("when the other rows' sum of W_t is 0 the eps = 1e-8 in the denominator keeps B_t = 0 / 1e-8 = 0; do not "
       "drop it")),
]


def _otb_slips(b, gi, leave_one_out):
    """The advantages that the usual slips in 3c and 3d (weights other than W_t; in 3d also the row's own
    term left in one of the two sums) give, {name: (A (B, T), what, hint)}. Computed on cases without
    padding, singletons or certain tokens, where they all differ from the right answer."""
    m = b["response_mask"]
    G = (b["token_rewards"] * m).flip(-1).cumsum(-1).flip(-1) * m  # G_t, (B, T)
    w = otb.token_energy(b["log_probs"], b["sum_pi_sq"]) * m  # w_t, (B, T)
    W = w.cumsum(-1) * m  # W_t, (B, T)
    gid, n_groups = otb.group_ids(gi, len(G))

    def group_sum(x):  # sum over the rows of each row's group, (B, T)
        return torch.zeros(n_groups, x.shape[1]).index_add_(0, gid, x)[gid]
    others = group_sum(m) - m  # other active rows of the group at t, (B, T)

    def adv(num, den):
        B = num / (den + 1e-8)  # B_t, (B, T)
        if leave_one_out:
            B = torch.where(others > 0, B, 0.0)
        return (G - B) * m  # A_t, (B, T)
    weights = {
        "an unweighted mean of G_t over the group": (
            torch.ones_like(W), H("B_t weighs each row by its realized energy W_t: sum_i G_t W_t m_t / "
            "(sum_i W_t m_t + eps)")),
        "weights w_t (this position's energy) instead of W_t": (
            w, H("W_t is the running sum w_0 + ... + w_t (your realized_energy of 3b), not w_t alone")),
        "weights W_t^2 instead of W_t": (W ** 2, H("weigh each row by W_t itself, not by its square")),
        "weights 1 / W_t instead of W_t": (
            1 / W, H("W_t multiplies: rows that accumulated more energy pull B_t harder, "
            "B_t = sum_i G_t W_t / (sum_i W_t + eps)")),
    }
    slips = {}
    for what, (v, hint) in weights.items():
        vm = v * m
        if leave_one_out:  # the same weighting slip inside the leave-one-out sums
            slips[what] = (adv(group_sum(G * vm) - G * vm, group_sum(vm) - vm), what + " (leave-one-out)", hint)
        else:
            slips[what] = (adv(group_sum(G * vm), group_sum(vm)), what, hint)
    if not leave_one_out:
        return slips
    GW = G * W
    slips.update({
        "the row's own term left in both sums (the 3c baseline)": (
            (G - group_sum(GW) / (group_sum(W) + 1e-8)) * m,
            "the row's own term left in both sums (that is 3c's baseline)",
            H("leave row i out: subtract its own G_t W_t from the numerator and its own W_t from the denominator")),
        "the row's own term removed from the numerator only": (
            adv(group_sum(GW) - GW, group_sum(W)), "the row's own term removed from the numerator only",
            H("subtract the row's own W_t^i from the denominator as well: sum_j W_t - W_t^i")),
        "the row's own term removed from the denominator only": (
            adv(group_sum(GW), group_sum(W) - W), "the row's own term removed from the denominator only",
            H("subtract the row's own G_t^i W_t^i from the numerator as well: sum_j G_t W_t - G_t^i W_t^i")),
    })
    return slips


def _one_group_in_every_row(got, b, gi, case):
    """NotYet if ``got`` gives every row the baseline of one group: ``B = ...`` inside the loop over groups
    rebinds B (B, T) to that group's B_t (T,), which (G - B) then broadcasts over all rows."""
    m = b["response_mask"]
    G = (b["token_rewards"] * m).flip(-1).cumsum(-1).flip(-1) * m  # G_t, (B, T)
    W = (otb.token_energy(b["log_probs"], b["sum_pi_sq"]) * m).cumsum(-1) * m  # W_t, (B, T)
    gid, n_groups = otb.group_ids(gi, len(G))
    for g in range(n_groups):
        rows = gid == g
        if rows.sum() > 1 and rows.sum() < len(G):
            B_g = (G[rows] * W[rows]).sum(0) / (W[rows].sum(0) + 1e-8)  # group g's B_t, (T,)
            if torch.allclose(got.double(), ((G - B_g) * m).double(), atol=1e-4, rtol=1e-4):
                raise NotYet(f"on the case '{case}' every row got the baseline B_t of one group (group {g})",
                             H("in the loop over groups, write only that group's rows, B[rows] = ...: B = ... "
                               "replaces the whole (B, T) tensor by one group's (T,) baseline, which (G - B) then "
                               "gives to every row"))


def _quietly(check_fn, *args, **kwargs):
    """Run another check without printing; returns (ok, the first 'problem:' line it would print)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        ok = check_fn(*args, **kwargs)
    problem = next((line.split("problem:", 1)[1].strip() for line in buf.getvalue().splitlines()
                    if "problem:" in line), "")
    return ok, problem


def _earlier_parts(parts):
    """Raise NotYet naming the first earlier exercise in ``parts`` [(label, name, check, fn, args)] whose
    own check fails: a later check that uses it would otherwise blame the later step."""
    for label, name, check_fn, fn, args in parts:
        if fn is None:
            continue
        ok, problem = _quietly(check_fn, fn, *args)
        if not ok:
            raise NotYet(f"your {name} ({label}), which this exercise uses, is not yet correct: {problem}",
                         H(f"fix {label} first (run its check cell: it says what differs and why), then run this "
                           f"check again"))


_EPS_HINT = {
    False: H("0 / 0 where every row's W_t is 0 (certain tokens): keep eps = 1e-8 in the denominator, "
             "B_t = sum_i G_t W_t m_t / (sum_i W_t m_t + eps)"),
    True: H("0 / 0: B_t^(-i) divides by the *other* rows' energy, which is 0 where no other row of the group is "
            "active at t (a singleton, the tail of the longest row) or where their tokens are all certain. Keep "
            "eps in the denominator, and set B_t^(-i) = 0 where no other row is active: "
            "torch.where(others > 0, num / (den + eps), 0.0) with others = mg.sum(0) - mg"),
}


def ex3c_optimal_token_baseline(student_fn, leave_one_out=False, reward_to_go=None, realized_energy=None):
    """student_fn(token_rewards, response_mask, group_index, log_probs, sum_pi_sq[, leave_one_out]) -> A (B, T).

    reward_to_go, realized_energy: the student's 3a and 3b, if given; when the baseline is not yet right
    and one of them fails its own check, the verdict says to fix that one first."""
    cases = _OTB_LOO_CASES if leave_one_out else _OTB_CASES
    extra = {"leave_one_out": True} if leave_one_out else {}

    def cases_body():
        for k, (case, lengths, gi, opts, hint) in enumerate(cases):
            b = _batch(lengths, seed=30 + k, **opts)
            args = (b["token_rewards"], b["response_mask"], gi, b["log_probs"], b["sum_pi_sq"])
            want = otb.optimal_token_baseline(*args, **extra)[0]
            got = _like(_call(student_fn, case, *(a.clone() if isinstance(a, torch.Tensor) else a for a in args),
                              allowed="ex3d_leave_one_out" if leave_one_out else "ex3c_optimal_token_baseline",
                              **extra), want)
            if isinstance(got, torch.Tensor) and got.shape == want.shape and \
                    not torch.allclose(got, want, atol=1e-4, rtol=1e-4):
                m = b["response_mask"]
                if not torch.isfinite(got).all():
                    bad = tuple((~torch.isfinite(got)).nonzero()[0].tolist())
                    raise NotYet(f"on the case '{case}' your advantage is {got[bad].item()} at index {bad}",
                                 _EPS_HINT[leave_one_out])
                if torch.allclose(got, -want, atol=1e-4, rtol=1e-4):
                    raise NotYet(f"on the case '{case}' your advantages have the opposite sign",
                                 H("the advantage is the return minus the baseline: A_t = G_t - B_t"))
                if torch.allclose(got * m, want, atol=1e-4, rtol=1e-4):
                    raise NotYet(f"on the case '{case}' your advantages are right on valid tokens but not 0 on "
                                 f"padding", H("multiply A_t = G_t - B_t by response_mask: B_t is shared by the "
                                               "group and is not 0 where this row has ended"))
                if not leave_one_out:
                    _one_group_in_every_row(got, b, gi, case)
                if k == 0:
                    for A, what, slip_hint in _otb_slips(b, gi, leave_one_out).values():
                        if torch.allclose(got, A, atol=1e-4, rtol=1e-4):
                            raise NotYet(f"on the case '{case}' you computed {what}", slip_hint)
                if leave_one_out:
                    gid, n_groups = otb.group_ids(gi, len(m))
                    others = torch.zeros(n_groups, m.shape[1]).index_add_(0, gid, m)[gid] - m  # (B, T)
                    alone = (others == 0) & (m > 0)  # valid positions with no other active row of the group
                    if alone.any() and torch.allclose(got, torch.where(alone, 0.0, want), atol=1e-4, rtol=1e-4):
                        t = tuple(alone.nonzero()[0].tolist())
                        raise NotYet(f"on the case '{case}' your advantage is 0 where no other row of the group is "
                                     f"active (first at index {t}, where it should be G_t = {want[t].item():.4g}): "
                                     f"the row's own return served as its baseline there",
                                     H("where no other row is active, B_t^(-i) = 0: the row keeps its return G_t "
                                       "as its advantage. Its own return is exactly what leave-one-out leaves out "
                                       "(torch.where(others > 0, num / (den + eps), 0.0))"))
            _compare(got, want, case, hint, atol=1e-4, rtol=1e-4)

    def body():
        try:
            cases_body()
        except NotYet:
            _earlier_parts([("3a", "reward_to_go", ex3a_reward_to_go, reward_to_go, ()),
                            ("3b", "realized_energy", ex3b_realized_energy, realized_energy, ())])
            raise
        what = "leave_one_out=True" if leave_one_out else "the default (own row included)"
        return f"Matches otb.optimal_token_baseline with {what} on every case."
    return _verdict(TITLES["ex3d_leave_one_out" if leave_one_out else "ex3c_optimal_token_baseline"], body)


def ex3d_leave_one_out(student_fn, reward_to_go=None, realized_energy=None):
    """Exercise 3d: ex3c_optimal_token_baseline with leave_one_out=True."""
    return ex3c_optimal_token_baseline(student_fn, leave_one_out=True, reward_to_go=reward_to_go,
                                       realized_energy=realized_energy)


# =====================================================================================
# Exercise 3e: your OTB inside train.py
# =====================================================================================

# A tiny model and a short warm-up: the same code path as `python train.py --estimator otb`, in seconds.
TRAIN_ARGS = ["--tiny-hidden", "32", "--tiny-layers", "1", "--horizon", "3", "--warmup-max-steps", "60",
              "--prompts-per-step", "8", "--group-size", "4", "--checkpoint-minutes", "1000", "--log-every", "1000",
              "--no-progress"]


def _train(estimator, out, steps):
    """The metrics rows of ``python train.py --estimator otb`` for ``steps`` steps, with
    otb.ESTIMATORS["otb"] replaced by ``estimator`` for the run (its output quietened)."""
    import warnings
    with warnings.catch_warnings():  # tqdm.auto, imported by train.py, warns in a notebook without ipywidgets
        warnings.filterwarnings("ignore", message="IProgress not found")
        import train  # the project's trainer: imported only when this check runs
    saved = otb.ESTIMATORS["otb"]
    otb.ESTIMATORS["otb"] = estimator
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            return train.main([*TRAIN_ARGS, "--estimator", "otb", "--steps", str(steps), "--out", str(out),
                               "--seed", str(_seed(0) % 2 ** 31),  # the prompts and draws: drawn when grading
                               "--name", "student" if estimator is not saved else "reference"])
    finally:
        otb.ESTIMATORS["otb"] = saved


def ex3e_trains(student_fn, steps=6):
    """Your optimal_token_baseline (3c) trains the tiny model exactly as otb.optimal_token_baseline does.

    Both runs start from the same weights and see the same prompts and random draws (train.py seeds
    them from (seed, step)), so with the same advantages they stay identical step for step; the
    first step where a metric parts names what went wrong."""
    import tempfile

    running = []  # non-empty while train.py is inside `student`: a call back into it is the student's
    calls = []  # train.py's calls of the estimator so far, which name the case on grade.py's tape

    def student(**inputs):  # train.py's call: keywords in, (advantages, returns) out
        calls.append(True)
        return _taped(f"batch {len(calls)} of train.py", lambda: answer(inputs)), None

    def answer(inputs):  # the student's advantages on one batch of train.py, checked; NotYet if not usable
        if running:  # the student's function called otb.ESTIMATORS["otb"], which is `student` during the run
            raise NotYet("your function calls otb.ESTIMATORS['otb'], which during this check is your own function "
                         "(the reference would prove nothing), so it calls itself",
                         H("write this step yourself from the formulas above (the helpers the instructions name "
                           "are fine)"))
        running.append(True)
        try:
            with _Watch("ex3e_trains") as watch:
                A = student_fn(inputs["token_rewards"], inputs["response_mask"], inputs["group_index"],
                               inputs["log_probs"], inputs["sum_pi_sq"])
        except NotYet:
            raise  # this check's own verdict from a call further in: passed on as it is, never nested
        except Exception as e:
            why = " ".join(str(e).split())  # one line: a multi-line message (a tensor, say) keeps its words
            raise NotYet(f"your function raised {type(e).__name__}: {why} on a batch of train.py",
                         H("run check.ex3c_optimal_token_baseline first: it shows the case that fails")) from None
        finally:
            running.clear()
        if watch.called:
            raise NotYet(f"your function calls {watch.called}, the project's reference code, so the comparison "
                         f"would prove nothing (this exercise hands you {', '.join(watch.allowed)})",
                         H("write this step yourself from the formulas above (the helpers the instructions name "
                           "are fine)"))
        if not isinstance(A, torch.Tensor) or A.shape != inputs["response_mask"].shape:
            got = f"a tensor of shape {tuple(A.shape)}" if isinstance(A, torch.Tensor) else repr(type(A).__name__)
            raise NotYet(f"train.py got {got} from your function, not a (B, T) tensor",
                         H("return the advantages A_t, one per token: the same shape as token_rewards"))
        if not torch.isfinite(A).all():
            raise NotYet("your function returned NaN or inf advantages on a batch of train.py",
                         H("a position where no row of a group has a valid token gives 0 / 0 in sum G_t W_t / "
                           "sum W_t: divide by (sum W_t + eps) and set B_t to 0 where the group has no valid token"))
        return A.to(inputs["response_mask"].dtype)

    def body():
        calls.clear()
        with tempfile.TemporaryDirectory() as out:
            want = _train(otb.ESTIMATORS["otb"], out, steps)
            got = _train(student, out, steps)
        for w, g in zip(want, got):
            for key in ("adv_mean", "adv_std", "loss", "grad_norm", "success"):
                if not math.isclose(g[key], w[key], rel_tol=1e-3, abs_tol=1e-5):
                    before = " (the runs were identical before it)" if w["step"] > 1 else ""
                    raise NotYet(f"at training step {w['step']} your run's {key} is {g[key]:.6g}, the "
                                 f"reference's {w[key]:.6g}{before}",
                                 H("your advantages differ from otb.optimal_token_baseline's on train.py's "
                                   "batches: run check.ex3c_optimal_token_baseline first"))
        return (f"{steps} training steps of train.py with your estimator: advantages, loss, gradient norm "
                f"and success equal the reference's at every step (last success {got[-1]['success']:.3f}).")
    return _verdict(TITLES["ex3e_trains"], body)


# =====================================================================================
# Exercise 4: bias and variance on the toy bandit (exact numbers from toy_env.py)
# =====================================================================================

def _toy_rows_and_advantages(en, N, groups, seed):
    """Sampled rows (groups * N,) and arbitrary advantages A (groups * N, T) on their valid tokens.

    g_hat is linear in A, so any A tests the contraction. Random A rather than an estimator's: on this
    sparse toy (~2% of responses succeed) most groups contain no success, every group baseline then gives
    A = 0, and a check on them would accept any function that returns zeros of the right shape.
    """
    import toy_env
    import toy_harness
    gen = _rng(seed)
    rows, _ = toy_harness.sample_groups(en, N, groups, gen)  # (G*N,)
    A = torch.randn(len(rows), en.mask.shape[1], generator=gen, dtype=en.scores.dtype) * en.mask[rows]  # (G*N, T)
    return rows, A


def ex4a_batch_gradients(student_fn, en):
    """student_fn(en, A, rows, N) -> g_hat (groups, P), compared with toy_harness.batch_gradients."""
    import toy_env
    import toy_harness

    def body():
        for N, groups in ((4, 50), (1, 7), (3, 20)):
            case = f"{groups} groups of N = {N}"
            rows, A = _toy_rows_and_advantages(en, N, groups, seed=N)
            want = toy_harness.batch_gradients(en, A, rows, N)  # (groups, P), the mean over each group
            got = _call(student_fn, case, en, A.clone(), rows.clone(), N, allowed="ex4a_batch_gradients")
            # float64 answers are compared to 1e-8; float32 ones to float32's precision (24 bits)
            tol = dict(rtol=1e-5, atol=1e-6 * want.abs().max().item()) if \
                isinstance(got, torch.Tensor) and got.dtype == torch.float32 else dict(rtol=1e-8, atol=1e-10)
            got = _like(got, want)
            if isinstance(got, torch.Tensor) and got.shape == want.shape and N > 1 and \
                    want.abs().max() > 0 and torch.allclose(got, N * want, **tol):
                raise NotYet(f"on the case '{case}' your gradients are N = {N} times too large",
                             H("g_hat is the *mean* over the N responses of a group, not the sum"))
            if isinstance(got, torch.Tensor) and got.shape == want.shape and N > 1 and groups > 1:
                g = torch.einsum("bt,btp->bp", A, en.scores[rows])  # (G*N, P)
                if torch.allclose(got, g.reshape(N, groups, -1).mean(0), **tol):
                    raise NotYet(f"on the case '{case}' you averaged rows that belong to different groups",
                                 H("rows are stored group after group (rows 0..N-1 are the first group): "
                                   "reshape(groups, N, P) and average over dim 1, not reshape(N, groups, P)"))
            if isinstance(got, torch.Tensor) and got.shape == want.shape and want.abs().max() > 0 and \
                    not torch.allclose(got, want, **tol):
                _batch_gradient_slips(got, want, en, A, rows, N, case, tol)
            _compare(got, want, case,
                     # when: a result that none of the slips this check names explains
                     H("g(tau_i) = sum_t A_t^i s_t^i with s_t^i = en.scores[rows] (G*N, T, P); then reshape to "
                       "(groups, N, P) and average over the N responses of each group"),
                     **tol, shape_hint=H("g_hat has one row per group: shape (groups, P), with groups = "
                                         "len(rows) // N"))
        return "Matches toy_harness.batch_gradients."
    return _verdict(TITLES["ex4a_batch_gradients"], body)


def _batch_gradient_slips(got, want, en, A, rows, N, case, tol):
    """Raise NotYet naming the slip if ``got`` is what a usual slip of 4a gives (a mean over positions, a
    product of sums, the scores of other responses), zeros, or the right answer times a constant; ``tol``:
    torch.allclose's rtol and atol for the answer's float type."""
    s = en.scores[rows]  # s_t^i, (G*N, T, P)
    L = en.mask[rows].sum(-1, keepdim=True)  # each response's number of valid tokens, (G*N, 1)
    per_group = lambda g: g.reshape(-1, N, g.shape[-1]).mean(1)  # noqa: E731  (G*N, P) -> (G, P)
    slips = {
        "a mean over the T positions, not the sum over t": (
            per_group(torch.einsum("bt,btp->bp", A, s) / A.shape[1]),
            H("g(tau_i) is the *sum* over positions t of A_t s_t (einsum 'bt,btp->bp'), not a mean over them")),
        "a mean over each response's valid tokens, not the sum over t": (
            per_group(torch.einsum("bt,btp->bp", A, s) / L.clamp(min=1)),
            H("g(tau_i) is the *sum* over positions t of A_t s_t (einsum 'bt,btp->bp'), not a mean over them")),
        "(sum_t A_t)(sum_t s_t), a product of two sums": (
            per_group(A.sum(-1, keepdim=True) * s.sum(1)),
            H("multiply A_t and s_t at each position t first, then sum over t: sum_t A_t s_t is not "
              "(sum_t A_t)(sum_t s_t)")),
        "the scores of responses 0..G*N-1 (en.scores[:len(rows)]), not those of the sampled rows": (
            per_group(torch.einsum("bt,btp->bp", A, en.scores[:len(rows)])),
            H("rows holds the indices of the sampled responses: their scores are en.scores[rows], (G*N, T, P)")),
    }
    for what, (value, hint) in slips.items():
        if torch.allclose(got, value, **tol):
            raise NotYet(f"on the case '{case}' you computed {what}", hint)
    if not got.abs().max() > 0:
        raise NotYet(f"on the case '{case}' your g_hat is 0 everywhere",
                     H("the check's advantages A are not 0 (it draws them at random): g(tau_i) = sum_t A_t s_t with "
                       "s = en.scores[rows], then the mean over the N responses of each group"))
    k = int(want.abs().argmax())
    c = (got.flatten()[k] / want.flatten()[k]).item()
    if c != 0 and torch.allclose(got, c * want, **tol):
        raise NotYet(f"on the case '{case}' your gradients are {c:.6g} times the expected ones",
                     H("a constant factor: sum over the positions t (not a mean), and average over the N "
                       "responses of each group (not a sum, not a division by the number of groups)"))


def _pair(got, case):
    """The (bias2, variance) pair a student's function returned, as floats; NotYet if it is not a pair of
    numbers (a tensor of one value counts as a number)."""
    pair = H("return a pair of numbers: (bias2, variance)")
    if not (isinstance(got, (tuple, list)) and len(got) == 2):
        raise NotYet(f"on the case '{case}' your function returned {type(got).__name__} "
                     f"{got if not isinstance(got, torch.Tensor) else tuple(got.shape)}", pair)
    for name, x in zip(("bias2", "variance"), got):
        if isinstance(x, torch.Tensor) and x.numel() != 1:
            raise NotYet(f"on the case '{case}' your {name} is a tensor of shape {tuple(x.shape)}, not one number",
                         H("bias2 and variance are one number each: ||mean - grad J||^2 and tr Cov both add up one "
                           "term per coordinate, so sum over the P coordinates too (.sum(), not .sum(0))"))
        if not isinstance(x, (int, float, torch.Tensor)) and not hasattr(x, "__float__"):
            raise NotYet(f"on the case '{case}' your {name} is {type(x).__name__}, not a number", pair)
    return tuple(float(x) for x in got)


def _same(x, y, scale):
    """x equals y to float32's precision (24 bits) of numbers of size ``scale``: a right answer may be computed
    in float32 or float64, and every slip 4b names moves a number by far more."""
    return math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-6 * abs(scale))


def ex4b_bias_and_variance(student_fn):
    """student_fn(g_hat, grad_J) -> (bias2, variance), compared with toy_harness.raw_stats."""
    import toy_harness
    g = _rng(40)
    grad_J = torch.randn(6, generator=g, dtype=torch.float64)
    g_hat = grad_J + 0.3 + torch.randn(200, 6, generator=g, dtype=torch.float64)  # biased by 0.3 per coordinate
    g = _rng(42)
    while True:  # unbiased estimates whose bias^2 estimate comes out below 0 (the first draw of seed 42 does)
        grad_J0 = torch.randn(6, generator=g, dtype=torch.float64)
        g_hat0 = grad_J0 + torch.randn(50, 6, generator=g, dtype=torch.float64)
        if toy_harness.raw_stats(g_hat0, grad_J0)[0]["bias2"] < 0:
            break
    cases = [("200 noisy estimates of a 6-dimensional gradient, biased by 0.3 per coordinate", g_hat, grad_J),
             ("50 unbiased noisy estimates (the bias^2 estimate is negative here)", g_hat0, grad_J0)]

    def body():
        for case, gh, gj in cases:
            bias2, variance = _pair(_call(student_fn, case, gh.clone(), gj.clone(), allowed="ex4b_bias_and_variance"),
                                    case)
            want = toy_harness.raw_stats(gh, gj)[0]
            G = gh.shape[0]
            dev_sq = ((gh - gh.mean(0)) ** 2).sum().item()
            naive_bias2 = ((gh.mean(0) - gj) ** 2).sum().item()
            scale = want["variance"]  # the size of both numbers (bias2 is a difference of numbers this size)
            if _same(bias2, want["variance"], scale) and _same(variance, want["bias2"], scale):
                raise NotYet(f"on the case '{case}' you returned (variance, bias2)",
                             H("return the pair in the order (bias2, variance)"))
            if _same(variance, dev_sq / G, scale):
                raise NotYet(f"on the case '{case}' your variance {variance:.6g} divides by G = {G}, expected "
                             f"{want['variance']:.6g}",
                             H("the unbiased estimate of tr Cov divides the sum of squared deviations by G - 1"))
            if _same(variance, want["variance"] / gh.shape[1], scale):
                raise NotYet(f"on the case '{case}' your variance {variance:.6g} is the mean over the coordinates, "
                             f"expected {want['variance']:.6g}",
                             H("variance = tr Cov: *sum* the sample variances over the P coordinates"))
            if not _same(variance, want["variance"], scale):
                raise NotYet(f"on the case '{case}' your variance is {variance:.6g}, expected {want['variance']:.6g}",
                             H("variance = tr Cov(g_hat) = sum over coordinates of the sample variance over groups"))
            if _same(bias2, naive_bias2, scale):
                raise NotYet(f"on the case '{case}' your bias2 {bias2:.6g} is ||mean g_hat - grad J||^2 itself, "
                             f"expected {want['bias2']:.6g}",
                             H("even an unbiased estimator gives ||mean - grad J||^2 > 0 with finite G: its "
                               "expectation is ||bias||^2 + variance / G, so subtract variance / G"))
            if _same(bias2, naive_bias2 - variance, scale):
                raise NotYet(f"on the case '{case}' your bias2 {bias2:.6g} subtracts the whole variance, expected "
                             f"{want['bias2']:.6g}",
                             H("the mean of G estimates has variance tr Cov / G: subtract variance / G"))
            if want["bias2"] < 0 and bias2 == 0.0:
                raise NotYet(f"on the case '{case}' your bias2 is 0, expected {want['bias2']:.6g} (negative)",
                             H("do not clip bias2 at 0: the formula is an unbiased estimate of a square, and when "
                               "the true bias is 0 it comes out negative about half the time; clipping makes it "
                               "biased (always too large on average)"))
            if not _same(bias2, want["bias2"], scale):
                raise NotYet(f"on the case '{case}' your bias2 is {bias2:.6g}, expected {want['bias2']:.6g}",
                             H("bias2 = ||mean over groups of g_hat - grad J||^2 - variance / G"))
        return ("Matches toy_harness.raw_stats (bias^2 with the Monte Carlo excess removed, negative values kept; "
                "unbiased variance).")
    return _verdict(TITLES["ex4b_bias_and_variance"], body)


def _digits(x, y):
    """x and y printed with enough significant digits to show that they differ."""
    for d in range(6, 17):
        a, b = f"{x:.{d}g}", f"{y:.{d}g}"
        if a != b:
            return a, b
    return repr(x), repr(y)


def _bias2_se(en, name, N, groups, seed, bias):
    """The standard error of toy_harness.measure's bias^2 of ``name`` at N on its groups (drawn from
    ``seed``), from Var(bias^2) = 4 b' Sigma b / G + 2 tr(Sigma^2) / G^2 at the larger of two bias vectors b:
    the sampled mean error (measure's own bias2_se) and the exact ``bias``. The sampled one alone is too
    small when the mean error happens to land near 0 (a right answer would then sit 5 of them off the exact
    bias^2 now and then); the exact one alone, when the bias is 0 (||e||^2 - tr Sigma / G is skewed)."""
    import toy_harness
    rows, gid = toy_harness.sample_groups(en, N, groups, torch.Generator().manual_seed(seed))  # measure's groups
    A = toy_harness.make_estimators(en)[name](rows, gid)  # (G*N, T)
    g_hat = toy_harness.batch_gradients(en, A, rows, N).double()  # (G, P)
    cov = torch.cov(g_hat.T)  # Sigma, (P, P)

    def var(b):  # Var(bias^2) for the bias vector b, (P,)
        return (4 * b @ cov @ b / groups + 2 * (cov ** 2).sum() / groups ** 2).item()
    return math.sqrt(max(var(g_hat.mean(0) - en.grad_J.double()), var(bias.double())))


def ex4c_measure(student_fn, en, Ns=(2, 4, 8), groups=4000, seed=0, batch_gradients=None,
                 bias_and_variance=None):
    """student_fn(en, name, N, groups, seed) -> (bias2, variance) for 'group_mean' and 'rloo'.

    Compared with toy_harness.measure on the same groups, then with the exact facts of Exercise 2:
    group mean = (N-1)/N x RLOO, so its variance is ((N-1)/N)^2 x RLOO's and its squared bias is
    ||grad J||^2 / N^2, while RLOO's is 0 (both within 5 standard errors, ``_bias2_se``).
    ``seed`` is the one of the notebook's example; grade.py draws another (``_seed``).

    batch_gradients, bias_and_variance: the student's 4a and 4b, if given; when a measurement differs and
    one of them fails its own check, the verdict says to fix that one first instead of blaming the sampling.
    """
    import toy_env
    import toy_harness
    grad_sq = (en.grad_J ** 2).sum().item()
    seed = _seed(seed)

    def body():
        table = []
        for N in Ns:
            got, ref = {}, {}
            for name in ("group_mean", "rloo"):
                case = f"{name}, N = {N}"
                out = _call(student_fn, case, en, name, N, groups, seed, allowed="ex4c_measure")
                if not (isinstance(out, (tuple, list)) and len(out) == 2):
                    raise NotYet(f"on the case '{case}' your function returned {out!r:.80}",
                                 H("return the pair (bias2, variance) from your bias_and_variance"))
                try:
                    got[name] = _pair(out, case)
                except NotYet:  # numbers that are not numbers come from 4b, if its check fails
                    _earlier_parts([("4b", "bias_and_variance", ex4b_bias_and_variance, bias_and_variance, ())])
                    raise
                ref[name] = toy_harness.measure(en, Ns=(N,), groups=groups, seed=seed, names=[name])[0]
                for k, key in enumerate(("bias2", "variance")):
                    # to float32's precision of numbers the size of the variance (bias2 is a difference of two)
                    if not math.isclose(got[name][k], ref[name][key], rel_tol=1e-6,
                                        abs_tol=1e-6 * ref[name]["variance"]):
                        _earlier_parts([("4a", "batch_gradients", ex4a_batch_gradients, batch_gradients, (en,)),
                                        ("4b", "bias_and_variance", ex4b_bias_and_variance, bias_and_variance, ())])
                        if name == "rloo" and all(math.isclose(got[name][j], got["group_mean"][j], rel_tol=1e-9)
                                                  for j in range(2)):
                            raise NotYet(f"on the case '{case}' you returned the same numbers as for group_mean",
                                         H("use the estimator named by `name`: otb.ESTIMATORS[name](...)"))
                        _measure_slips(got[name], ref[name], en, name, N, groups, seed, case)
                        yours, theirs = _digits(got[name][k], ref[name][key])
                        raise NotYet(f"on the case '{case}' your {key} is {yours}, toy_harness.measure gives "
                                     f"{theirs} on the same groups (relative difference "
                                     f"{abs(got[name][k] / ref[name][key] - 1) if ref[name][key] else math.inf:.1e})",
                                     # when: a result that none of the slips this check names explains
                                     H("sample with toy_harness.sample_groups(en, N, groups, "
                                       "torch.Generator().manual_seed(seed)), get advantages from "
                                       "otb.ESTIMATORS[name](**en.batch(rows), group_index=gid)[0], then use "
                                       "your batch_gradients and bias_and_variance"))
            # The exact facts of Exercise 2, on numbers that equal toy_harness.measure's by now: no answer
            # fails here, so these two hints are guards on the project's code, not on the student's.
            ratio = got["group_mean"][1] / got["rloo"][1]
            if not math.isclose(ratio, ((N - 1) / N) ** 2, rel_tol=1e-6):
                raise NotYet(f"at N = {N} the variance ratio group_mean / rloo is {ratio:.6g}, but "
                             f"((N-1)/N)^2 = {((N - 1) / N) ** 2:.6g} exactly",
                             # when: toy_harness.measure's two variances are not in the ratio ((N-1)/N)^2
                             H("measure both estimators on the same groups (same seed)"))
            for name, exact, bias in (("group_mean", grad_sq / N ** 2, -en.grad_J / N), ("rloo", 0.0, 0 * en.grad_J)):
                se = _bias2_se(en, name, N, groups, seed, bias)
                if abs(got[name][0] - exact) > 5 * se:
                    raise NotYet(f"at N = {N}, {name}'s bias^2 {got[name][0]:.3g} is more than 5 standard "
                                 f"errors ({se:.2g}) from the exact {exact:.3g}",
                                 # when: toy_harness.measure's bias^2 is 5 standard errors off the exact one
                                 H("use more groups"))
            table.append((N, got, grad_sq / N ** 2))
        print(f"{'N':>3} {'estimator':>11} {'bias^2':>10} {'exact bias^2':>13} {'variance':>9} {'MSE':>9}")
        for N, got, exact in table:
            for name, ex in (("group_mean", exact), ("rloo", 0.0)):
                b2, var = got[name]
                print(f"{N:>3} {name:>11} {b2:>10.2e} {ex:>13.2e} {var:>9.4f} {b2 + var:>9.4f}")
        return ("Your measurements match toy_harness.measure, the variance ratio is ((N-1)/N)^2 and the squared "
                "biases agree with ||grad J||^2 / N^2 (group mean) and 0 (RLOO) within 5 standard errors.")
    return _verdict(TITLES["ex4c_measure"], body)


def _measure_slips(got, ref, en, name, N, groups, seed, case):
    """Raise NotYet naming the slip if the pair ``got`` is what a usual slip of 4c gives: the pair in the
    wrong order, other arguments to sample_groups or to the estimator, or other groups altogether (close
    to toy_harness.measure's row ``ref`` within the noise, but not equal)."""
    import toy_harness

    def stats(rows, gid, pick=0):  # (bias2, variance) with the harness's own 4a and 4b
        A = otb.ESTIMATORS[name](**en.batch(rows), group_index=gid)[pick]  # (G*N, T)
        r = toy_harness.raw_stats(toy_harness.batch_gradients(en, A, rows, N), en.grad_J)[0]
        return r["bias2"], r["variance"]
    rows, gid = toy_harness.sample_groups(en, N, groups, torch.Generator().manual_seed(seed))
    swapped_rows, swapped_gid = toy_harness.sample_groups(en, groups, N, torch.Generator().manual_seed(seed))
    slips = {
        "you returned the pair in the order (variance, bias2)": (
            (ref["variance"], ref["bias2"]), H("return the pair in the order (bias2, variance)")),
        "you passed group_index=rows (the response indices), not the group ids": (
            stats(rows, rows), H("group_index says which group each row belongs to: pass the group ids that "
                                 "sample_groups returns (rows, gid = ...; group_index=gid), not the rows")),
        "you took the returns (the estimator's [1]), not its advantages ([0])": (
            stats(rows, gid, pick=1), H("otb.ESTIMATORS[name](...) returns (advantages, returns): take [0]")),
        "you sampled with N and groups swapped (sample_groups(en, groups, N, ...))": (
            stats(swapped_rows, swapped_gid), H("the arguments are sample_groups(en, N, groups, generator): N "
                                                "responses per group, then the number of groups")),
    }
    def off(pair):  # the largest relative difference between got and a slip's pair
        return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(got, pair))
    near = sorted((off(pair), k, what, pair, hint) for k, (what, (pair, hint)) in enumerate(slips.items())
                  if all(math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-12) for x, y in zip(got, pair)))
    if near:  # two slips can give nearly the same pair on a draw: the one closest to got is named, ...
        best = near[0][3]
        # ... or, where they give the same pair (the returns, and group_index=rows when no success is drawn
        # twice), every slip that does, since the numbers cannot tell them apart
        same = [(what, hint) for _, _, what, pair, hint in near
                if all(math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-15) for x, y in zip(pair, best))]
        raise NotYet(f"on the case '{case}' " + ", or ".join(what for what, _ in same) +
                     (" (on these groups they give the same numbers)" if len(same) > 1 else ""),
                     "; or ".join(hint for _, hint in same))
    if all(abs(x - ref[key]) <= 8 * ref[key + "_se"] for x, key in zip(got, ("bias2", "variance"))):
        raise NotYet(f"on the case '{case}' your (bias2, variance) = ({got[0]:.4g}, {got[1]:.4g}) agree with "
                     f"toy_harness.measure's ({ref['bias2']:.4g}, {ref['variance']:.4g}) within their noise, but "
                     f"not exactly: you measured other groups",
                     H("use exactly the groups asked for: toy_harness.sample_groups(en, N, groups, "
                       "torch.Generator().manual_seed(seed)) (seeded with seed itself, not seed + 1, not "
                       "torch.manual_seed, not an unseeded generator)"))


# =====================================================================================
# Exercise 5: align a baseline by the policy's own tokens (responses with tool output)
# =====================================================================================

def _tool_batch(masks, seed=0, junk=7.0, groups=None):
    """A batch whose masks have holes (tool output, mask 0, inside a response): masks are strings such
    as '1100111000' (one per row). Outcome reward at the last valid token; junk in every masked
    position of the rewards, log-probs and sum pi^2 (only the mask says what is an action).

    The outcomes are drawn again until they are mixed within every group (``groups``: the rows' group ids,
    one group by default) among its rows with a valid token: in a group whose outcomes are all equal every
    advantage is 0, and an answer aligned the wrong way would pass there."""
    mask = torch.tensor([[float(c) for c in s] for s in masks])  # (B, T)
    b = _batch([len(s) for s in masks], seed=seed)
    last = (mask * torch.arange(mask.shape[1])).argmax(-1)  # the last valid position, (B,)
    rewards = torch.zeros_like(mask)
    g = _rng(seed)
    ids = [0] * len(masks) if groups is None else list(groups)
    rows = [[k for k in range(len(masks)) if ids[k] == i and mask[k].any()] for i in set(ids)]  # non-empty
    outcome = torch.randint(0, 2, (len(masks),), generator=g)  # R in {0, 1}
    while any(len(r) > 1 and outcome[r].min() == outcome[r].max() for r in rows):
        outcome = torch.randint(0, 2, (len(masks),), generator=g)
    rewards[torch.arange(len(masks)), last] = outcome.float()
    out = dict(token_rewards=rewards, log_probs=b["log_probs"], sum_pi_sq=b["sum_pi_sq"])
    out = {k: torch.where(mask.bool(), v, junk) for k, v in out.items()}
    return dict(out, response_mask=mask)


def _naive_action_index(mask):
    """k_t = (number of valid tokens up to and including t) - 1 on valid positions, -1 elsewhere."""
    k = torch.full(mask.shape, -1, dtype=torch.long)
    for i, row in enumerate(mask.tolist()):
        seen = 0
        for t, m in enumerate(row):
            if m:
                k[i, t], seen = seen, seen + 1
    return k


_HOLES = ["1110011100", "1111111111", "1001110000", "0000000000"]  # a hole, none, an early hole, empty


def _long_masks(rows=4, T=256, seed=5):
    """Masks of long responses as strings: runs of actions, tool holes of 2-8 tokens, right padding.

    Long rows matter: a sort without stable=True keeps equal keys in order on short rows by luck,
    but not on rows of a hundred or more positions (and on a GPU the order is unspecified)."""
    g = _rng(seed)
    masks = []
    for _ in range(rows):
        length = int(torch.randint(T // 2, T + 1, (), generator=g))
        row = ""
        while len(row) < length:
            row += "1" * int(torch.randint(3, 20, (), generator=g)) + "0" * int(torch.randint(2, 9, (), generator=g))
        masks.append((row[:length - 1] + "1").ljust(T, "0"))
    return masks


def _compaction_cases():
    """The masks of Exercise 5's cases: a fixed set of holes, and long random ones (drawn when grading)."""
    return [("tool output inside the responses (junk 7.0 in the holes)", _HOLES),
            ("long responses (256 positions) with many tool holes", _long_masks())]


def ex5a_action_index(student_fn):
    """student_fn(response_mask) -> k_t (B, T), integer, -1 on masked positions."""
    cases = [("no holes, right padding", ["1111100", "1110000"]),
             ("tool output inside the responses", _HOLES),
             ("long responses (256 positions) with many tool holes", _long_masks())]  # drawn when grading

    def body():
        for case, masks in cases:
            m = torch.tensor([[float(c) for c in s] for s in masks])
            want = _naive_action_index(m)
            got = _call(student_fn, case, m.clone(), allowed="ex5a_action_index")
            if isinstance(got, torch.Tensor) and got.shape == want.shape and not torch.equal(got.long(), want):
                valid = m.bool()
                positions = torch.arange(m.shape[1]).expand(m.shape)  # t, (B, T)
                if torch.equal(got.long()[valid], want[valid]):
                    bad = (~valid & (got.long() != -1)).nonzero()[0].tolist()
                    raise NotYet(f"on the case '{case}' your k_t is right on the actions, but at the masked "
                                 f"position {tuple(bad)} it is {got[tuple(bad)].item()}, not -1",
                                 H("cumsum(m) - 1 also runs on holes and padding: put -1 there with "
                                   "torch.where(m.bool(), k, -1)"))
                if torch.equal(got.long()[valid], positions[valid]):
                    raise NotYet(f"on the case '{case}' your k_t is the position t",
                                 H("count only the policy's tokens: k_t = cumsum(m) - 1, so a hole does not "
                                   "advance k"))
                if torch.equal(got.long()[valid], want[valid] + 1):
                    raise NotYet(f"on the case '{case}' your k_t starts at 1",
                                 H("the first action has k = 0: subtract 1 from the cumulative sum"))
            _compare(got.double() if isinstance(got, torch.Tensor) else got, want.double(), case,
                     H("k_t = m.cumsum(-1) - 1 on valid positions, and -1 where m_t = 0 (torch.where)"), atol=0)
            if got.dtype != torch.long:
                raise NotYet(f"on the case '{case}' your k_t has the right values but dtype {got.dtype}, expected "
                             f"torch.int64 (long), as the docstring says",
                             H("k_t is an index: return an integer tensor of dtype torch.long (cumsum of "
                               "response_mask.long(), and -1 as an integer), which gather and scatter accept"))
        return "k_t counts the policy's own tokens and skips the tool's output, as integers."
    return _verdict(TITLES["ex5a_action_index"], body)


def ex5b_compaction(to_actions, from_actions):
    """to_actions(x, m) -> (x_k, m_k): valid entries moved left in order, 0 after them; m_k right-padded.
    from_actions(y_k, m) -> y_t, the inverse on valid positions, 0 on masked ones."""
    def body():
        for k, (case, masks) in enumerate(_compaction_cases()):
            b = _tool_batch(masks, seed=50 + k)
            x, m = b["log_probs"], b["response_mask"]
            out = _call(to_actions, case, x.clone(), m.clone(), allowed="ex5b_compaction")
            if not (isinstance(out, (tuple, list)) and len(out) == 2):
                raise NotYet(f"on the case '{case}' to_actions returned {type(out).__name__}, not a pair",
                             H("return (x_k, m_k)"))
            n = m.sum(-1, keepdim=True)  # actions per row, (B, 1)
            m_k = (torch.arange(m.shape[1]) < n).float()  # (B, T)
            x_k = torch.zeros_like(x)
            for i in range(len(x)):
                x_k[i, :int(n[i])] = x[i][m[i].bool()]
            _compare(out[1], m_k, case + ": m_k", H("m_k is 1 on the first n_i positions of row i (n_i = its "
                                                    "number of actions) and 0 after: right padding, no holes"),
                     atol=0)
            _compare(out[0] * m_k, x_k, case + ": x_k",
                     H("keep the order of the valid entries: a sort without stable=True may reorder equal keys (it "
                       "does on long rows, and on a GPU the order is unspecified): idx = torch.argsort(m == 0, "
                       "dim=-1, stable=True), then x.gather(-1, idx)"), atol=0)
            # Values over k, also after each row's n_i actions (where a batch over k is padding): from_actions
            # must put 0 on every masked position t whatever y_k holds there.
            y_k = torch.randn(x.shape, generator=_rng(51 + k))  # (B, T)
            want = torch.zeros_like(x)
            for i in range(len(x)):
                want[i][m[i].bool()] = y_k[i, :int(n[i])]
            case = f"scattering values over k back to the positions t ({case})"
            got = _like(_call(from_actions, case, y_k.clone(), m.clone(), allowed="ex5b_compaction"), want)
            if isinstance(got, torch.Tensor) and got.shape == want.shape and torch.equal(got * m, want) and \
                    not torch.equal(got, want):
                bad = tuple((got != want).nonzero()[0].tolist())
                raise NotYet(f"on the case '{case}' your values are right on the actions, but the masked position "
                             f"{bad} holds {got[bad].item():.4g}, not 0 (y_k has values after each row's n_i "
                             f"actions too)", H("multiply the scattered values by response_mask: the entries of y_k "
                                                "after a row's n_i actions land on its holes and padding"))
            _compare(got, want, case,
                     H("the inverse of the gather: torch.zeros_like(y_k).scatter(-1, idx, y_k) with the same stable "
                       "idx (argsort(m == 0, dim=-1, stable=True)); masked positions (holes, padding) must be 0"),
                     atol=0)
        return "to_actions gathers each row's actions to the left in order, and from_actions puts them back."
    return _verdict(TITLES["ex5b_compaction"], body)


def ex5c_action_aligned_otb(student_fn):
    """student_fn(token_rewards, response_mask, group_index, log_probs, sum_pi_sq, leave_one_out=False)
    -> A (B, T), compared with otb.action_aligned_otb (the 'otb_tir' estimator)."""
    cases = [("no holes: the position-aligned OTB", ["1111100", "1111110", "1110000", "1111111"],
              [0, 0, 0, 0], {}, H("without holes k_t = t: you should get otb.optimal_token_baseline exactly")),
             ("tool output inside the responses", ["1110011100", "1111111100", "1100001110", "1111000000"],
              [0, 0, 0, 0], {}, None),
             ("two interleaved groups", _HOLES + ["1011011000", "1111001110"], [0, 1, 0, 1, 0, 1], {},
              H("pass group_index through unchanged: otb.optimal_token_baseline groups the rows itself")),
             ("leave-one-out", ["1110011100", "1111111100", "1100001110"], ["a", "a", "a"],
              {"leave_one_out": True}, H("pass leave_one_out on to otb.optimal_token_baseline"))]

    def body():
        for k, (case, masks, gi, extra, hint) in enumerate(cases):
            b = _tool_batch(masks, seed=60 + k, groups=gi)
            args = (b["token_rewards"], b["response_mask"], gi, b["log_probs"], b["sum_pi_sq"])
            want = otb.action_aligned_otb(*args, **extra)[0]
            got = _like(_call(student_fn, case, *(a.clone() if isinstance(a, torch.Tensor) else a for a in args),
                              allowed="ex5c_action_aligned_otb", **extra), want)
            by_position = otb.optimal_token_baseline(*args, **extra)[0]
            if isinstance(got, torch.Tensor) and got.shape == want.shape and \
                    not torch.allclose(by_position, want, atol=1e-5) and torch.allclose(got, by_position, atol=1e-5):
                raise NotYet(f"on the case '{case}' you aligned the rows by position t",
                             H("gather the actions to the left first (to_actions), run OTB over k, "
                               "scatter back"))
            if isinstance(got, torch.Tensor) and got.shape == want.shape and not torch.allclose(got, want, atol=1e-5):
                m = b["response_mask"]
                idx = torch.argsort(m == 0, dim=-1, stable=True)  # t_k, (B, T)
                r_k, m_k, lp_k, s_k = (x.gather(-1, idx) for x in (args[0], m, args[3], args[4]))  # over k
                if torch.allclose(got, otb.optimal_token_baseline(r_k, m_k, gi, lp_k, s_k, **extra)[0], atol=1e-5):
                    raise NotYet(f"on the case '{case}' your advantages are indexed by action k, not by position t",
                                 H("scatter them back to the positions of the actions with from_actions(A_k, "
                                   "response_mask): tool output and padding get 0"))
                A_k = otb.optimal_token_baseline(args[0], m_k, gi, lp_k, s_k, **extra)[0]  # rewards left over t
                if torch.allclose(got, torch.zeros_like(A_k).scatter(-1, idx, A_k) * m, atol=1e-5):
                    raise NotYet(f"on the case '{case}' you gave OTB the rewards at their positions t and the other "
                                 f"inputs over the actions k",
                                 H("gather token_rewards with to_actions too (the same idx): every input of "
                                   "otb.optimal_token_baseline is indexed by action k, or a reward lands on "
                                   "another action"))
            _compare(got, want, case, hint or (
                # when: a result that none of the slips this check names explains
                H("to_actions on token_rewards, log_probs and sum_pi_sq (same idx), otb.optimal_token_baseline on "
                  "(x_k, m_k), then from_actions on its advantages")), atol=1e-5, rtol=1e-5)
        return "Matches otb.action_aligned_otb (otb_tir) with holes, junk in them, groups and leave-one-out."
    return _verdict(TITLES["ex5c_action_aligned_otb"], body)
