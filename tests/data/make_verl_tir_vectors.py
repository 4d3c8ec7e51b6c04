"""Make ``verl_tir_reference_vectors.json``: verl 0.9.1's two OTB functions on batches with holes.

A response of tool-integrated reasoning interleaves the policy's tokens with tool output that the
environment inserted; those tokens have mask 0 *inside* the response (holes), not only as right
padding. This script runs verl's own functions on such batches, in float64, and saves inputs and
outputs; ``tests/test_exact_verl_tir_parity.py`` reads the JSON. The tests never run this script:
it needs the verl wheel, and verl is not a dependency of the project. The exact commands:

    pip download verl==0.9.1 --no-deps -d /tmp/verl
    python tests/data/make_verl_tir_vectors.py /tmp/verl/verl-0.9.1-py3-none-any.whl

The wheel's sha256 must be db6e6f2a8d9d5808d9ec32d357a42319fdc6967df688ff9d9810050f49bfdd14
(checked). Only the source of the two functions is read from ``verl/trainer/ppo/core_algos.py``
inside the wheel and executed with torch and numpy; nothing of verl is imported or installed. The
output is the same byte for byte on every run (fixed seeds, float64).

- ``compute_optimal_token_baseline_advantage`` (adv estimator ``optimal_token_baseline``): aligned
  by position t; stored as ``otb`` (handle_zero_tail=False) and ``otb_zero_tail`` (True);
- ``compute_multi_turn_optimal_token_baseline_advantage`` (``tir_optimal_token_baseline``): aligned
  by the k-th token the policy generated; stored as ``otb_tir`` and ``otb_tir_zero_tail``.

Both are called with epsilon=1e-8 and, in the case ``tool_holes_is_weights``, rollout_is_weights.
The inputs: groups of sizes 1-8 interleaved; each row alternates policy segments (mask 1) with
tool segments (mask 0) and is right-padded, and a few rows have no valid token at all; log pi(y_t) and sum pi^2 come from softmaxes of random
logits (vocabulary 6), every position included (holes hold the log-probs a scoring pass would
give the tool's tokens); importance weights are min(pi_old / pi_rollout, 2) with the rollout's
logits perturbed. Rewards: the outcome reward at the last valid token, or (process rewards)
sparse rewards anywhere, holes included, where both functions must ignore them.
"""
import ast
import hashlib
import json
import sys
import zipfile
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

VERSION = "0.9.1"
WHEEL_SHA256 = "db6e6f2a8d9d5808d9ec32d357a42319fdc6967df688ff9d9810050f49bfdd14"
SOURCE = "verl/trainer/ppo/core_algos.py"
FUNCTIONS = {"otb": "compute_optimal_token_baseline_advantage",
             "otb_tir": "compute_multi_turn_optimal_token_baseline_advantage"}
OUT = Path(__file__).with_name("verl_tir_reference_vectors.json")
VOCAB = 6


def load_verl_functions(wheel):
    """{our name: verl's function}, executed from the wheel's source without its decorators."""
    digest = hashlib.sha256(Path(wheel).read_bytes()).hexdigest()
    if digest != WHEEL_SHA256:
        sys.exit(f"{wheel}: sha256 {digest}, expected {WHEEL_SHA256} (verl {VERSION})")
    with zipfile.ZipFile(wheel) as z:
        source = z.read(SOURCE).decode()
    defs = {node.name: ast.get_source_segment(source, node) for node in ast.parse(source).body
            if isinstance(node, ast.FunctionDef) and node.name in FUNCTIONS.values()}
    namespace = dict(torch=torch, np=np, defaultdict=defaultdict)
    for name in FUNCTIONS.values():
        exec(defs[name], namespace)  # the function's own text, from "def" on
    return {ours: namespace[theirs] for ours, theirs in FUNCTIONS.items()}


def tool_mask_row(rng, T, turns, empty=False, holes=True):
    """One row's response mask (T,): policy segments separated by tool segments, then padding."""
    m = np.zeros(T)
    if empty:
        return m
    t = int(rng.integers(0, 2)) if holes else 0  # sometimes the row starts with the tool's output
    for turn in range(turns):
        n = int(rng.integers(1, 4))  # the policy's tokens of this turn
        m[t:t + n] = 1.0
        t += n + (int(rng.integers(1, 4)) if holes else 0)  # then the tool's output
        if t >= T - 1:
            break
    return m


def make_case(seed, sizes, T, *, holes=True, process=False, with_isw=False, empty_in=()):
    """empty_in: the groups whose first row has no valid token at all."""
    rng = np.random.default_rng(seed)
    gid = rng.permutation(np.repeat(np.arange(len(sizes)), sizes))  # interleaved groups, (B,)
    B = len(gid)
    empty = {int(np.flatnonzero(gid == g)[0]) for g in empty_in}
    turns = rng.integers(1, 4, B)
    m = np.stack([tool_mask_row(rng, T, int(turns[i]), i in empty, holes) for i in range(B)])  # (B, T)
    lengths = np.where(m.any(1), T - np.argmax(m[:, ::-1], 1), 0)  # one past the last valid token
    r = np.zeros((B, T))
    has = lengths > 0
    r[np.flatnonzero(has), lengths[has] - 1] = rng.choice([0.0, 1.0, -0.5, 2.0], int(has.sum()))
    if process:  # sparse rewards anywhere before the end, holes included (they must be ignored)
        r += (rng.random((B, T)) < 0.3) * rng.normal(size=(B, T)) * (np.arange(T) < lengths[:, None])
    logits = rng.normal(size=(B, T, VOCAB)) * rng.choice([0.5, 1.0, 3.0], (B, 1, 1))
    logp = torch.log_softmax(torch.tensor(logits), -1)  # (B, T, V)
    tokens = torch.tensor(rng.integers(0, VOCAB, (B, T)))
    lp = logp.gather(-1, tokens[..., None])[..., 0]  # log pi(y_t), (B, T)
    case = dict(seed=seed, group_index=[f"p{g}" for g in gid], response_mask=m.tolist(),
                token_level_rewards=r.tolist(), old_log_probs=lp.tolist(),
                sum_pi_squared=logp.exp().square().sum(-1).tolist())
    if with_isw:  # truncated importance weights pi_old / pi_rollout, the rollout's logits perturbed
        rollout = torch.log_softmax(torch.tensor(logits + 0.4 * rng.normal(size=logits.shape)), -1)
        ratio = (lp - rollout.gather(-1, tokens[..., None])[..., 0]).exp()  # pi_old / pi_rollout
        case["rollout_is_weights"] = ratio.clamp(max=2.0).tolist()
    return case


CASES = {  # name: make_case arguments
    "tool_holes": dict(seed=11, sizes=[4, 1, 3, 5, 2], T=16, empty_in=[3]),
    "tool_holes_process_rewards": dict(seed=12, sizes=[3, 4, 2, 4], T=14, process=True),
    "tool_holes_is_weights": dict(seed=13, sizes=[5, 2, 4, 1], T=16, with_isw=True, empty_in=[0]),
    "tool_holes_large": dict(seed=14, sizes=[8, 6, 4, 8, 5, 3, 8, 2], T=40),
    "right_padded": dict(seed=15, sizes=[4, 3, 1, 5], T=12, holes=False),
    # a group of two whose other row has no valid token: the one case where otb_tir departs from verl
    "one_row_with_actions": dict(seed=16, sizes=[2, 3, 2], T=12, empty_in=[0]),
}


def main(argv):
    if len(argv) != 1:
        sys.exit(__doc__)
    verl = load_verl_functions(argv[0])
    cases = {}
    for name, kwargs in CASES.items():
        case = make_case(**kwargs)
        t = {k: torch.tensor(case[k], dtype=torch.float64) for k in ("token_level_rewards", "response_mask",
                                                                     "old_log_probs", "sum_pi_squared")}
        isw = case.get("rollout_is_weights")
        isw = None if isw is None else torch.tensor(isw, dtype=torch.float64)
        case["expected"] = {}
        for ours, fn in verl.items():
            for zero_tail in (False, True):
                adv, ret = fn(t["token_level_rewards"], t["response_mask"], np.array(case["group_index"]),
                              t["old_log_probs"], t["sum_pi_squared"], rollout_is_weights=isw,
                              handle_zero_tail=zero_tail, epsilon=1e-8)
                key = ours + ("_zero_tail" if zero_tail else "")
                case["expected"][key] = dict(advantages=adv.tolist(), returns=ret.tolist())
        cases[name] = case
    data = dict(
        description=(f"verl {VERSION}'s compute_optimal_token_baseline_advantage (otb, otb_zero_tail) "
                     "and compute_multi_turn_optimal_token_baseline_advantage (otb_tir, otb_tir_zero_tail), "
                     "handle_zero_tail False / True, epsilon 1e-8, run in float64 on right-padded batches "
                     "whose responses have holes (mask 0 on tool output). Tensors are nested lists (batch, "
                     "length); group_index: one prompt id per row. "
                     "Made by tests/data/make_verl_tir_vectors.py."),
        verl=dict(version=VERSION, wheel_sha256=WHEEL_SHA256, source=SOURCE, functions=FUNCTIONS),
        command=f"python tests/data/make_verl_tir_vectors.py verl-{VERSION}-py3-none-any.whl",
        cases=cases)
    OUT.write_text(json.dumps(data) + "\n")
    print(f"wrote {OUT} ({len(cases)} cases)")


if __name__ == "__main__":
    main(sys.argv[1:])
