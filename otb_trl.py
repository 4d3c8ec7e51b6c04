"""OTB inside TRL: ``GRPOTrainer`` with its advantages taken from ``otb.ESTIMATORS``.

    from otb_trl import OTBGRPOTrainer
    trainer = OTBGRPOTrainer(model, reward_funcs, args=GRPOConfig(...), train_dataset=ds,
                             estimator="otb")          # or group_mean, grpo, rloo, otb_loo, reinforce;
                                                       # otb_tir when the trainer runs tools (below;
                                                       # without estimator=: otb, or otb_tir with tools)
    trainer.train()

    python otb_trl.py                    # the example: a few OTB steps on the tiny model, CPU, offline
    python otb_trl.py --help

Needs TRL (``pip install -r requirements-trl.txt``); written against trl 1.16 (see below).

What TRL computes
-----------------
``GRPOTrainer`` samples ``num_generations`` completions per prompt, scores them with the reward
functions, turns the rewards into one advantage per completion (group mean, optionally divided
by the group std: ``scale_rewards``) in ``_generate_and_score_completions``, and then, in
``_compute_loss``, runs the grad-enabled forward pass and the clipped policy-gradient loss. Its
forward pass never materialises the (B, T, V) logits: a fused LM head (``add_fused_lm_head``)
folds each tile of logits into running sums and returns log pi(y_t) and the entropy. With one
update per generation batch (``num_iterations=1``, the default) TRL runs *no* separate scoring
pass: the loss's forward pass is the only one.

Where OTB plugs in
------------------
OTB needs, for every response token, log pi(y_t) and sum_k pi_k^2 of the current policy (the
Logit-Gradient Proxy, otb.py eq. (7)). Three small overrides:

1. ``__init__`` asks the fused LM head for one more output, ``log_sum_sq_probs`` =
   log sum_k pi_k^2, which its tiles already compute (float32, from the same logits): no extra
   forward pass, no (B, T, V) tensor.
2. ``_generate_and_score_completions`` keeps TRL's rollout and rewards and adds each row's
   outcome reward R and group id to the batch. If TRL ran a scoring pass anyway (PPO-style
   reuse: ``num_iterations > 1``, or vLLM importance sampling), the advantages are computed
   from that pass right away.
3. Otherwise they are computed inside ``_compute_loss``: ``_get_per_token_logps_and_entropies``
   returns the loss pass's log-probs and sum pi^2, and the (B, T) advantages
   ``otb.ESTIMATORS[estimator](...)`` are written into the batch before TRL's loss reads them
   (TRL reads ``inputs["advantages"]`` only after its forward pass). The log-probs are those of
   the parameters the loss differentiates, exactly what train.py's scoring pass computes.

TRL's loss already accepts (B, T) advantages (it unsqueezes only (B,) ones), so nothing in the
loss changes: ``loss_type="dapo"`` (TRL's default, a token mean over the batch) is the
aggregation train.py uses.

With tools: ``estimator="otb_tir"``
-----------------------------------
When ``GRPOTrainer`` runs tools (``tools=[...]``), it inserts each tool's result into the completion
and builds a ``tool_mask``, 0 on the result's tokens: they are the environment's, not the policy's
actions. This trainer multiplies that mask into ``completion_mask``, so tool results enter no sum of
any estimator (a completion's R sits at the last token the policy generated). Position-aligned
``otb`` would still pool the rows of a group by position t, where one row's t-th token can be its
5th action and another's its 12th after tool results of other lengths. ``otb_tir``
(``otb.action_aligned_otb``, eq. (8) of otb.py) pools them by the policy's own tokens, the k-th
action of each row, as verl's ``tir_optimal_token_baseline`` does (tested against verl's function):
it is the OTB to use whenever the trainer runs tools. Without tools it equals ``otb`` exactly.
So without an explicit ``estimator`` the trainer starts with ``otb`` and switches to ``otb_tir`` at
the first batch with a ``tool_mask``, saying so once; an explicit position-aligned OTB (``otb``,
``otb_loo``, ``otb_zero_tail``) is kept, with one warning. The group baselines give one number per
completion, so holes do not change them.

What differs from TRL's own advantages, and from train.py
---------------------------------------------------------
- ``scale_rewards`` is ignored: the estimator decides (``grpo`` divides by the group std with
  eps 1e-6, TRL by std + 1e-4). ``group_mean`` equals TRL's ``scale_rewards="none"``.
- R is the weighted sum of the reward functions; a completion for which every reward function
  returned None gets R = 0 (TRL instead gives it advantage 0 and drops it from the group mean).
  ``multi_objective_aggregation="normalize_then_sum"`` is refused.
- Rows of one group must reach the estimator together. When TRL splits a generation batch over
  several accumulation micro-batches (``steps_per_generation > 1``) without a scoring pass, this
  trainer runs one extra no-grad forward pass per generation batch (text models only); set
  ``steps_per_generation=1`` to avoid it.
- One process only (the groups' log-probs are not gathered across processes).
- TRL's completions table still logs TRL's own per-completion advantages; the metrics
  ``otb/adv_mean`` and ``otb/adv_abs_mean`` log the token-level ones used in the loss.

Why trl 1.16: it is the release whose fused LM head exposes ``log_sum_sq_probs`` and whose loss
takes (B, T) advantages; the overridden methods are private, so requirements-trl.txt pins
``trl>=1.16,<1.17`` and tests/test_e2e_trl.py checks the result against otb.py on every run.
"""
import argparse
import dataclasses
import logging
import sys
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch

import otb
import tasks

try:
    from accelerate.utils import is_peft_model
    from trl import GRPOConfig, GRPOTrainer
    from trl.trainer.utils import add_fused_lm_head
except ImportError:  # one line, no traceback through TRL's internals
    if __name__ == "__main__":
        print("otb_trl.py: error: needs TRL: pip install -r requirements-trl.txt", file=sys.stderr)
        sys.exit(2)
    raise ImportError("otb_trl needs TRL: pip install -r requirements-trl.txt") from None


logger = logging.getLogger("otb_trl")
POSITION_ALIGNED = ("otb", "otb_loo", "otb_zero_tail")  # per-token baselines pooled by position t


class OTBGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` whose (B, T) advantages come from ``otb.ESTIMATORS[estimator]``."""

    def __init__(self, *args, estimator=None, **kwargs):
        if estimator is not None and estimator not in otb.ESTIMATORS:
            raise ValueError(f"estimator must be one of {sorted(otb.ESTIMATORS)}, got {estimator!r}")
        self.estimator = estimator or "otb"  # None: otb, or otb_tir once a batch has a tool_mask
        self._chosen = estimator is not None  # given explicitly: never switched, warned if it ignores holes
        self._told = False  # the switch or the warning is said once
        self._sum_pi_sq = []  # sum_k pi_k^2 of each forward pass since the last rollout, (B, T) each
        self._rewards = None  # R of the current rollout, (B,)
        self._fill_advantages_of = None  # the batch whose advantages the loss pass must compute
        super().__init__(*args, **kwargs)
        if self.accelerator.num_processes > 1:
            raise ValueError("OTBGRPOTrainer runs in one process: the groups' log-probs are not gathered "
                             f"across the {self.accelerator.num_processes} processes")
        if self.multi_objective_aggregation != "sum_then_normalize":
            raise ValueError("multi_objective_aggregation must be 'sum_then_normalize' (R is the weighted sum "
                             f"of the rewards), got {self.multi_objective_aggregation!r}")
        # (1) TRL patched the policy's forward with a fused LM head returning log pi and entropy;
        # patch it once more asking also for log sum_k pi_k^2, from the same tiles of logits.
        policy = self.model.get_base_model() if is_peft_model(self.model) else self.model  # as TRL does
        add_fused_lm_head(policy, temperature=self.temperature, cast_lm_head_to_fp32=self.args.cast_lm_head_to_fp32,
                          outputs=("log_probs", "entropy", "log_sum_sq_probs"))

    # ---------------------------------------------------------------- rewards and rollout (2)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)  # (B, F)
        weights = self.reward_weights.to(rewards_per_func.device)
        self._rewards = (rewards_per_func * weights).nansum(dim=1)  # R, all-None rows -> 0, (B,)
        return rewards_per_func

    def train(self, *args, **kwargs):
        with checkpointing_names_quiet():  # TRL's own calls of transformers' deprecated names
            return super().train(*args, **kwargs)

    def _generate_and_score_completions(self, inputs):
        self._sum_pi_sq = []
        batch = super()._generate_and_score_completions(inputs)
        B = batch["completion_ids"].shape[0]
        n = self.num_generations if self.model.training else self.num_generations_eval
        batch["otb_rewards"] = self._rewards  # R, (B,)
        batch["otb_group"] = torch.arange(B, device=self._rewards.device) // n  # consecutive groups, (B,)
        if "old_per_token_logps" in batch:  # TRL ran a scoring pass: its sum pi^2 came with it
            self._set_advantages(batch, batch["old_per_token_logps"], self._sum_pi_sq[0])
        elif self.model.training and self.args.steps_per_generation > 1:  # groups would be split
            with torch.no_grad():
                logp = self._get_per_token_logps_and_entropies(
                    self.model, torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1),
                    torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1),
                    batch["completion_ids"].shape[1], batch_size=self.args.per_device_train_batch_size)[0]
            self._set_advantages(batch, logp, self._sum_pi_sq[-1])
        else:
            batch["advantages"] = None  # (3): filled in by the loss's own forward pass
        return batch

    # ---------------------------------------------------------------- the loss's forward pass (3)

    def _compute_loss(self, model, inputs):
        self._fill_advantages_of = inputs if inputs["advantages"] is None else None
        try:
            return super()._compute_loss(model, inputs)
        finally:
            self._fill_advantages_of = None

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        """TRL's method, which also keeps sum_k pi_k^2 of every scored chunk of rows."""
        chunks = []

        def forward(**model_inputs):  # TRL calls model(**inputs, labels=..., fused_lm_head=True)
            out = model(**model_inputs)
            if out.log_sum_sq_probs is not None:  # None for a reference model (not re-patched)
                chunks.append(out.log_sum_sq_probs[:, -logits_to_keep:].exp())  # sum pi^2, (b, T)
            return out

        logps, entropies, aux = super()._get_per_token_logps_and_entropies(
            forward, input_ids, attention_mask, logits_to_keep, *args, **kwargs)
        if chunks:
            self._sum_pi_sq.append(torch.cat(chunks))  # (B, T)
            if self._fill_advantages_of is not None:
                self._set_advantages(self._fill_advantages_of, logps.detach(), self._sum_pi_sq[-1])
        return logps, entropies, aux

    # ---------------------------------------------------------------- tools: align OTB by action

    def _align_by_action(self):
        """The batch holds tool results (holes in the mask). Without an explicit estimator, switch from
        otb to otb_tir and say so; an explicit position-aligned OTB gets a warning. Once per trainer."""
        if self._told:
            return
        self._told = True
        if not self._chosen:
            self.estimator = "otb_tir"
            logger.warning("OTBGRPOTrainer: the completions hold tool results (tool_mask): estimator otb_tir, "
                           "OTB aligned by the policy's own tokens (pass estimator= to choose another)")
        elif self.estimator in POSITION_ALIGNED:
            warnings.warn(f"OTBGRPOTrainer: estimator {self.estimator!r} pools a group's rows by position, but the "
                          "completions hold tool results of different lengths (tool_mask); otb_tir pools them by "
                          "action (docs/tool_use.md)", stacklevel=2)

    # ---------------------------------------------------------------- the one line that is OTB

    def _set_advantages(self, batch, log_probs, sum_pi_sq):
        """batch["advantages"] = A_t from otb.ESTIMATORS[estimator], (B, T), 0 on masked tokens."""
        mask = batch["completion_mask"].float()  # m_t, (B, T)
        if "tool_mask" in batch:
            mask = mask * batch["tool_mask"]  # tool outputs are not the policy's actions
            self._align_by_action()
        last = tasks.last_valid(mask)  # the last valid token of each row, (B,)
        token_rewards = torch.zeros_like(mask)  # r_t: the outcome reward R at the last valid token
        token_rewards[torch.arange(len(last)), last] = batch["otb_rewards"].float()
        adv, _ = otb.ESTIMATORS[self.estimator](token_rewards=token_rewards * mask, response_mask=mask,
                                                group_index=batch["otb_group"], log_probs=log_probs.float(),
                                                sum_pi_sq=sum_pi_sq.float())  # A_t, (B, T)
        batch["advantages"] = adv
        mode = "train" if self.model.training else "eval"
        tokens = mask.sum().clamp(min=1)
        self._metrics[mode]["otb/adv_mean"].append((adv.sum() / tokens).item())
        self._metrics[mode]["otb/adv_abs_mean"].append((adv.abs().sum() / tokens).item())


# =====================================================================================
# The example: a few GRPOTrainer steps with OTB on the project's tiny model, CPU, offline
# =====================================================================================

def reverse_dataset(task, tok, n, seed):
    """n reversal prompts as TRL wants them: {"prompt": text, "answer": reversed string}."""
    import random
    from datasets import Dataset
    pairs = task.sample(random.Random(seed), n)
    return Dataset.from_list([{"prompt": task.prompt_text(tok, q), "answer": a} for q, a in pairs])


def task_reward(task, eos_id):
    """A TRL reward function for one of train.py's tasks (lab/options.py's TASKS): the task's own 0/1
    reward of the text, with "finished" meaning the completion ended in EOS."""
    def reward(completions, answer, completion_ids, **_):
        return [task.reward(text, a, len(ids) > 0 and ids[-1] == eos_id)
                for text, a, ids in zip(completions, answer, completion_ids)]
    reward.__name__ = type(task).__name__
    return reward


def tiny_setup(cache="runs"):
    """The tiny model (warmed up and cached under <cache>/_cache by models.py, as train.py does),
    its tokenizer, the task and train.py's default configuration."""
    import train
    from lab import options
    cfg = train.Config(out=cache)
    model, tok, _ = options.load(cfg, torch.device("cpu"))
    return model, tok, options.make_task(cfg), cfg


def grpo_config(out, cfg, steps, prompts_per_step, max_new_tokens=18, **overrides):
    """GRPOConfig matching train.py's defaults: one update per batch, AdamW at a constant LR,
    clipping at 1.0, no KL term, fp32 on the CPU, nothing written but the output folder.
    max_new_tokens: 18 is train.py's limit for the reversal task (2 * horizon + 2)."""
    settings = dict(output_dir=str(out), use_cpu=True, bf16=False, fp16=False, report_to="none",
                    save_strategy="no", logging_steps=1, disable_tqdm=True, seed=cfg.seed, max_steps=steps,
                    per_device_train_batch_size=prompts_per_step * cfg.group_size, num_generations=cfg.group_size,
                    max_completion_length=max_new_tokens, temperature=cfg.temperature, learning_rate=cfg.lr,
                    lr_scheduler_type="constant", weight_decay=cfg.weight_decay, max_grad_norm=cfg.max_grad_norm,
                    beta=0.0, epsilon=cfg.clip_eps, loss_type="dapo", shuffle_dataset=False)
    # TRL's default (checkpointing on), under the name transformers >= 5.x reads; the old name warns
    new_name = "activation_checkpointing" in {f.name for f in dataclasses.fields(GRPOConfig)}
    settings["activation_checkpointing" if new_name else "gradient_checkpointing"] = True
    return GRPOConfig(**{**settings, **overrides})


@contextmanager
def checkpointing_names_quiet():
    """TRL 1.16 calls ``model.gradient_checkpointing_enable``, ``_disable`` and ``is_gradient_checkpointing``,
    which recent transformers deprecate (FutureWarning at every generation batch) in favour of
    ``activation_checkpointing*``. The calls are inside TRL, so those warnings, and only those, are dropped."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`(is_)?gradient_checkpointing\w*` is deprecated",
                                category=FutureWarning)
        yield


def main(argv=None):
    p = argparse.ArgumentParser(description="A few GRPOTrainer steps with an estimator of otb.ESTIMATORS "
                                "on the tiny model and the reversal task (CPU, offline).",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--estimator", default="otb", choices=sorted(otb.ESTIMATORS), help="advantage estimator")
    p.add_argument("--steps", type=int, default=5, help="training steps (one rollout batch each)")
    p.add_argument("--prompts-per-step", type=int, default=16, help="prompts per step (x 4 completions)")
    p.add_argument("--out", default="runs/otb_trl", help="TRL's output folder (nothing is saved but logs)")
    args = p.parse_args(argv)
    for flag, value in (("--steps", args.steps), ("--prompts-per-step", args.prompts_per_step)):
        if value < 1:
            p.error(f"argument {flag}: must be an integer >= 1, got {value}")
    if Path(args.out).is_file():
        p.error(f"argument --out: {args.out} is a file, not a folder")
    print("python otb_trl.py " + " ".join(sys.argv[1:] if argv is None else argv), flush=True)
    model, tok, task, cfg = tiny_setup()
    data = reverse_dataset(task, tok, args.steps * args.prompts_per_step, cfg.seed)
    trainer = OTBGRPOTrainer(model, reward_funcs=task_reward(task, tok.eos_token_id),
                             args=grpo_config(args.out, cfg, args.steps, args.prompts_per_step),
                             train_dataset=data, processing_class=tok, estimator=args.estimator)
    from transformers import PrinterCallback
    trainer.remove_callback(PrinterCallback)  # TRL's raw log dicts; one line per step below instead
    trainer.train()
    for row in trainer.state.log_history:
        if "reward" in row:
            print(f"step {row['step']:3d} | reward {row['reward']:.3f} | adv |A| {row['otb/adv_abs_mean']:.3f} "
                  f"| grad_norm {row['grad_norm']:.3f} | len {row['completions/mean_length']:.1f}")
    return trainer


if __name__ == "__main__":
    main()
