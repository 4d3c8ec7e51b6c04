"""Make sampler_before_tools.json: rollout.sample's output as it was before tools existed.

Run on the last version of rollout.sample without a ``tool`` argument (docs/tool_use.md names it):

    python tests/data/make_sampler_reference.py

It samples the random tiny Llama of tests/test_naive_rollout.py on its three prompts, for a few
seeds and temperatures, and stores the tokens, the mask and the sampler's log-probs. The test
test_sampling_without_a_tool_is_unchanged compares today's sampler against these numbers exactly
(float32 log-probs survive a JSON round trip unchanged).
"""
import json
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent.parent), str(HERE.parent)]
import rollout  # noqa: E402
from test_naive_rollout import EOS, PAD, PROMPTS, tiny_llama  # noqa: E402

CASES = [dict(seed=s, temperature=tau, group_size=3, max_new_tokens=10)
         for s in (0, 3, 5) for tau in (1.0, 0.7)]


def main():
    model = tiny_llama()
    out = []
    for case in CASES:
        ro = rollout.sample(model, PROMPTS, group_size=case["group_size"],
                            max_new_tokens=case["max_new_tokens"], temperature=case["temperature"],
                            eos_id=EOS, pad_id=PAD, generator=torch.Generator().manual_seed(case["seed"]))
        out.append(dict(case, response=ro.response.tolist(), response_mask=ro.response_mask.tolist(),
                        logp=ro.logp.tolist(), finished=ro.finished.tolist()))
    (HERE / "sampler_before_tools.json").write_text(json.dumps(dict(
        made_by="tests/data/make_sampler_reference.py, rollout.sample before its tool argument", torch=torch.__version__,
        cases=out)) + "\n")


if __name__ == "__main__":
    main()
