"""HydraModel: policy, frozen reference, value head and reward head on one trunk.

The bottom `L - N` decoder layers are frozen and shared; they run once per batch.
The top `N` layers (the originals, in place) are the trainable policy; a frozen copy
of the original top layers is the reference; an optional frozen reward branch is a
third set of top layers with a scalar head.

A band mid-stack may train instead (model/band.py): the split is at its bottom, policy and reference
(a copy of the band) run on through the same frozen layers above; a reward branch copies all from the split up.

How the branches run without per-architecture code: every pass goes through the
model's OWN decoder forward (its embeddings, causal/sliding-window masks, rotary
embeddings, per-layer attention types and final norm). For a branch pass the decoder
layer list is edited for the duration of the call: bottom layers become `SkipLayer`s (split.py)
that cost nothing and hand the cached split hidden state to the first top layer, and
the top slots hold the branch's layers. Only the lm_head (run in chunks, see
logprobs.py) and the model's logit post-processing are applied outside the model,
and both are checked against the model's own logits when the hydra is built.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from .arch import (
    UnsupportedModelError,
    cache_argument,
    heads_are_tied,
    locate,
    logits_transform,
    output_embeddings,
    set_path,
)
from .band import trainable_range
from .heads import RewardHead, ValueHead
from .logprobs import token_logprobs
from .lora import lora_problems
from .probe import verify
from .reward_branch import RewardBranch, pooled_scores
from .shared_prompt import plan_packing
from .split import SkipLayer, StopTrunk, position_ids_from_mask, split_hook


@dataclass
class HydraOutput:
    """What one hydra pass returns. Per-token tensors over a sequence of length T:
    log-probs and entropy are (B, T-1) and score `input_ids[:, 1:]`; values are (B, T).
    Positions whose token is padding hold 0."""

    logprobs: torch.Tensor
    values: torch.Tensor | None
    ref_logprobs: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    split_hidden: torch.Tensor | None = None
    scores: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    ref_logits: torch.Tensor | None = None


def disable_dropout(model: nn.Module) -> None:
    """PPO's importance ratios assume the same network that sampled; dropout breaks that.

    Sets every nn.Dropout to p=0 and zeroes float attributes named like `*dropout*`
    (attention modules read `self.attention_dropout` as a float in transformers).
    """
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
        for name, value in list(vars(module).items()):
            if "dropout" in name and isinstance(value, float):
                setattr(module, name, 0.0)


def _frozen_copy(module: nn.Module) -> nn.Module:
    clone = copy.deepcopy(module)
    clone.requires_grad_(False)
    return clone


class HydraModel(nn.Module):
    """One transformer trunk holding policy, reference, critic and (optionally) reward model.

    Args:
        model: a transformers causal LM (`AutoModelForCausalLM`).
        num_layers_unfrozen: N, the number of top decoder layers that train. 0 trains the
            heads only (the policy IS the reference); -1 or N >= number of layers trains the
            whole model and keeps a complete frozen copy as the reference.
        trainable_layers: a band "START:END" or (start, end), 0-based, end exclusive, with
            start >= 1, trained instead of the top N (num_layers_unfrozen is then ignored).
        train_lm_head: also train the output embeddings. A head tied to the input
            embeddings is untied into its own trainable copy first, so that no gradient
            reaches the embeddings or the bottom layers.
        train_final_norm: also train the final norm.
        layers_path: dotted path of the decoder layer list, for models hydrappo does not
            find on its own (e.g. "model.layers").
        logprob_chunk_tokens: positions per lm_head chunk (default: 128 MB of float32 logits).
        lora: a `peft.LoraConfig`: train LoRA adapters instead of the top layers' weights.
            The reference is then the same layers with the adapters switched off, and no
            layer is copied. `lora_layers="top"` puts adapters in the top N layers only
            (the trunk below stays shared and cached); "all" in every layer (the reference
            then costs a second trunk pass). See hydrappo/lora.py.
        lora_init_adapter: a trained peft adapter to start from; it is merged into the
            base first, so the reference is that starting policy.
        value_head: build the critic's value head (False for critic-free RL: `values` is None).
        verify: check at construction that hydrappo reproduces the model's own logits.
    """

    trunk_quantization = "none"  # "int8" | "4bit" once model/quantize.py has quantized the frozen bottom

    def __init__(
        self,
        model: nn.Module,
        num_layers_unfrozen: int = 2,
        *,
        trainable_layers: tuple[int, int] | None = None,
        train_lm_head: bool = False,
        train_final_norm: bool = False,
        layers_path: str | None = None,
        logprob_chunk_tokens: int | None = None,
        lora=None,
        lora_layers: str = "top",
        lora_init_adapter: str | None = None,
        value_head: bool = True,
        verify: bool = True,
    ):
        super().__init__()
        _check_model_usable(model)
        broken = lora_problems(
            lora is not None, num_layers_unfrozen, lora_layers, lora_init_adapter, train_lm_head, train_final_norm
        )
        if broken:
            raise ValueError(" ".join(map(str, broken)))
        if lora_init_adapter is not None:
            from .lora import merge_adapter

            model = merge_adapter(model, lora_init_adapter)
        self.model = model
        self.arch = locate(model, layers_path)
        num_layers = self.arch.num_layers
        self.uses_lora = lora is not None
        if self.uses_lora and lora_layers not in ("top", "all"):
            raise ValueError(f"lora_layers={lora_layers!r}: use 'top' (the trainable layers) or 'all'.")
        # The trainable layers are layer_list[split_index:band_end]; those above band_end stay
        # frozen and are shared by the policy and reference paths (none for top N).
        self.split_index, self.band_end = trainable_range(
            num_layers_unfrozen,
            trainable_layers,
            num_layers,
            adapters_everywhere=self.uses_lora and lora_layers == "all",
        )
        self.num_layers_unfrozen = self.band_end - self.split_index
        self.full_model = self.num_layers_unfrozen == num_layers and not self.uses_lora
        self.train_lm_head = train_lm_head or self.full_model
        self.train_final_norm = train_final_norm or self.full_model
        self.logprob_chunk_tokens = logprob_chunk_tokens
        self._logits_transform = logits_transform(model)
        self._layer_tuple_len = 0
        # Whether rows that share a prompt may pass it once (model/shared_prompt.py): the probe in
        # _verify decides; without verification every row passes whole.
        self.shares_prompts = False
        self.prompt_sharing_problem = "not checked (the hydra was built with verify=False)"
        disable_dropout(model)

        self._build_reference(model, lora, lora_layers)

        param = next(model.parameters())
        # A critic-free run (GRPO, RLOO, REINFORCE++) has no value head: nothing built, trained or saved.
        head_dtype = torch.promote_types(param.dtype, torch.float32)  # float32, or float64 with a float64 trunk
        self.value_head = ValueHead(self.arch.hidden_size).to(param.device, head_dtype) if value_head else None
        self.reward_branch: RewardBranch | None = None
        if verify:
            self._verify()

    # ------------------------------------------------------------------ construction

    def _build_reference(self, model: nn.Module, lora, lora_layers: str) -> None:
        """Freeze the model, make trainable what trains, and build the reference: a whole frozen
        copy (every layer trains), the adapters switched off (LoRA), or frozen copies of the
        trainable layers (and of the head and norm where they train)."""
        model.requires_grad_(False)
        self.reference_model = None
        self.ref_layers = nn.ModuleList()
        self.ref_norm = None
        self.ref_lm_head = None
        # Not a registered submodule: the PeftModel wraps self.model, whose parameters are
        # already ours; registering it would list them twice in state dicts.
        object.__setattr__(self, "peft_model", None)
        # How the reference is built decides how it runs (_reference_hidden), once; with N = 0 and
        # a frozen head the policy is the reference (forward_hydra copies its log-probs).
        self.shares_reference = False
        if self.full_model:
            # Everything trains, so nothing of the policy can serve as the reference.
            self.reference_model = _frozen_copy(model)
            model.requires_grad_(True)
            self._reference_hidden = self._reference_of_model_copy
        elif self.uses_lora:
            from .lora import attach_lora

            top = list(range(self.split_index, self.band_end)) if lora_layers == "top" else None
            pattern = self.arch.layers_path.rpartition(".")[2]
            object.__setattr__(self, "peft_model", attach_lora(model, lora, self.arch.layers, top, pattern))
            self._reference_hidden = self._reference_with_adapters_off
        else:
            self._reference_hidden = self._reference_of_top_copy
            self.shares_reference = self.num_layers_unfrozen == 0 and not (self.train_lm_head or self.train_final_norm)
            top = self.arch.layers[self.split_index : self.band_end]
            # Only the trainable layers are copied: both paths run the frozen ones above a band.
            self.ref_layers = nn.ModuleList(_frozen_copy(layer) for layer in top)
            top.requires_grad_(True)
            if self.train_final_norm:
                norm = self.arch.final_norm
                if norm is None:
                    raise UnsupportedModelError(
                        f"train_final_norm=True but hydrappo found no final norm in {type(model).__name__}."
                    )
                self.ref_norm = _frozen_copy(norm)
                norm.requires_grad_(True)
            if self.train_lm_head:
                self.ref_lm_head = _frozen_copy(output_embeddings(model))
                if heads_are_tied(model):
                    _untie_output_embeddings(model)
                output_embeddings(model).requires_grad_(True)

    @classmethod
    def from_pretrained(
        cls,
        path: str,
        num_layers_unfrozen: int = 2,
        *,
        train_lm_head: bool = False,
        train_final_norm: bool = False,
        layers_path: str | None = None,
        logprob_chunk_tokens: int | None = None,
        **model_kwargs,
    ) -> HydraModel:
        """Load a causal LM with `AutoModelForCausalLM.from_pretrained(path, **model_kwargs)` and wrap it."""
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(path, **model_kwargs)
        return cls(
            model,
            num_layers_unfrozen,
            train_lm_head=train_lm_head,
            train_final_norm=train_final_norm,
            layers_path=layers_path,
            logprob_chunk_tokens=logprob_chunk_tokens,
        )

    @property
    def config(self):
        return self.model.config

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def branch_depth(self) -> int:
        """Layers from the split to the top: what a branch pass runs and a reward branch copies."""
        return self.arch.num_layers - self.split_index

    @property
    def is_band(self) -> bool:
        """Whether frozen layers sit above the trainable ones (a band rather than the top N)."""
        return self.band_end < self.arch.num_layers

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    def attach_reward_branch(self, branch: RewardBranch) -> None:
        """Put a (frozen) reward model on the trunk; forward_hydra then returns `scores`."""
        if self.full_model:
            raise UnsupportedModelError(
                "a reward branch needs a frozen trunk to sit on; with num_layers_unfrozen=-1 (the whole model "
                "trains) there is none. Use a reward function or a separate reward model instead."
            )
        if len(branch.layers) != self.branch_depth:
            raise ValueError(
                f"the reward branch has {len(branch.layers)} layers but the hydra splits the trunk "
                f"{self.branch_depth} layers below the top; train the reward branch with the same num_layers_unfrozen "
                "(or trainable_layers)."
            )
        branch.requires_grad_(False)
        self.reward_branch = branch.to(self.device)

    def new_reward_branch(self, trainable: bool = False, own_norm: bool = False, heads: int = 1) -> RewardBranch:
        """A reward branch initialised from the ORIGINAL top layers (the reference copy) and a fresh head
        (`heads` > 1: an ensemble of that many heads, model/heads.py's RewardHead).

        `own_norm=True` gives the branch its own copy of the original final norm even where
        the policy shares the model's: the reward stage trains it, and a PPO run that trains
        the final norm (train_final_norm) must not change the reward model with it."""
        if self.full_model or self.split_index == 0:
            raise UnsupportedModelError(
                "reward branches need a frozen trunk below them: num_layers_unfrozen < number of layers "
                "(and, with LoRA, lora_layers='top')."
            )
        # It runs from the split to the top: for a band, the band's original weights and the layers above.
        if self.uses_lora:
            from .lora import strip_lora

            layers = nn.ModuleList(strip_lora(layer) for layer in self.arch.layers[self.split_index :])
        else:
            above = self.arch.layers[self.band_end :]
            layers = nn.ModuleList(copy.deepcopy(layer) for layer in [*self.ref_layers, *above])
        original_norm = self.ref_norm if self.ref_norm is not None else (self.arch.final_norm if own_norm else None)
        norm = copy.deepcopy(original_norm) if original_norm is not None else None
        head = RewardHead(self.arch.hidden_size, heads).to(
            torch.promote_types(next(self.model.parameters()).dtype, torch.float32)
        )
        branch = RewardBranch(layers, head, norm).to(self.device)
        branch.requires_grad_(trainable)
        return branch

    # ------------------------------------------------------------------ passes
    def forward_hydra(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        *,
        return_entropy: bool = False,
        return_logits: bool = False,
        return_reference: bool = True,
        temperature: float = 1.0,
        logprobs_from: int = 0,
        split_hidden: torch.Tensor | None = None,
        shared_prompt_width: int | None = None,
    ) -> HydraOutput:
        """Policy log-probs, reference log-probs, values and (with a reward branch) scores,
        from ONE pass of the embeddings and the bottom layers, or from none: `split_hidden`,
        the bottom's output for these very tokens (recorded while sampling, see
        `recording_split`), lets only the branches run.

        `logprobs_from=k` computes log-probs (and entropy) only for the tokens
        `input_ids[:, k+1:]`, e.g. the response of a batch whose prompts fill the first
        k+1 columns: PPO never reads the prompt's log-probs, and each skipped position saves
        an lm_head row per branch. Skipped entries hold 0; shapes do not change. A reward
        branch with mean pooling averages over the tokens from column `logprobs_from+1` on
        (the response, with the packing above).

        `shared_prompt_width=P` says that the first P columns are the prompt (left-padded) and
        the rest the response: on a cached `split_hidden`, rows with the same prompt then pass it
        once through the branches (model/shared_prompt.py), with the same result."""
        attention_mask = _default_mask(input_ids, attention_mask)
        position_ids = position_ids_from_mask(attention_mask)
        from_trunk = split_hidden is None or self.full_model
        if from_trunk:
            hidden, split_hidden = self._trunk_and_policy(input_ids, attention_mask, position_ids)
        # One packing serves the policy's branch and the reference's, planned only where one of
        # them runs on the split (from the trunk, the policy's pass was whole already).
        reference_branch = return_reference and not self.shares_reference
        packing = None
        if not from_trunk or reference_branch:
            packing = self._prompt_packing(split_hidden, input_ids, attention_mask, position_ids, shared_prompt_width)
        if not from_trunk:
            hidden = self._branch_hidden(split_hidden, input_ids, attention_mask, position_ids, None, None, packing)
        out = self._policy_outputs(
            hidden, input_ids, attention_mask, return_entropy, return_logits, temperature, logprobs_from
        )
        out.split_hidden = split_hidden

        if return_reference:
            with torch.no_grad():
                if self.shares_reference:
                    out.ref_logprobs = out.logprobs.detach().clone()
                    out.ref_logits = out.logits.detach().clone() if return_logits else None
                else:
                    ref_hidden, ref_head = self._reference_hidden(
                        split_hidden, input_ids, attention_mask, position_ids, packing
                    )
                    out.ref_logprobs = self._logprobs(
                        ref_hidden, input_ids, attention_mask, ref_head, temperature, logprobs_from=logprobs_from
                    )[0]
                    if return_logits:
                        out.ref_logits = self._logits_transform(ref_head(ref_hidden))
        if self.reward_branch is not None:
            out.scores = self.score_from_split(
                split_hidden, input_ids, attention_mask, response_start=logprobs_from + 1
            )
        return out

    def forward_top(
        self,
        split_hidden: torch.Tensor | None,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        *,
        return_entropy: bool = False,
        return_logits: bool = False,
        temperature: float = 1.0,
        logprobs_from: int = 0,
        shared_prompt_width: int | None = None,
    ) -> HydraOutput:
        """The policy outputs of `forward_hydra` from a cached `split_hidden`, without
        running the bottom layers (the PPO epochs use this). With the whole model
        training there is no frozen split: pass None and the full model runs.
        `shared_prompt_width`: as forward_hydra's."""
        attention_mask = _default_mask(input_ids, attention_mask)
        position_ids = position_ids_from_mask(attention_mask)
        if self.full_model or split_hidden is None:
            if not self.full_model:
                raise ValueError("forward_top needs the split_hidden returned by forward_hydra.")
            hidden = self._decoder_hidden(self.arch.decoder, input_ids, attention_mask, position_ids)
        else:
            packing = self._prompt_packing(split_hidden, input_ids, attention_mask, position_ids, shared_prompt_width)
            hidden = self._branch_hidden(split_hidden, input_ids, attention_mask, position_ids, None, None, packing)
        return self._policy_outputs(
            hidden, input_ids, attention_mask, return_entropy, return_logits, temperature, logprobs_from
        )

    @torch.no_grad()
    def score_from_split(
        self, split_hidden, input_ids, attention_mask, response_start: int | None = None
    ) -> torch.Tensor:
        """The reward branch's score of each sequence, pooled as the branch says (see reward_scores)."""
        if self.reward_branch is None:
            raise ValueError("no reward branch is attached (see attach_reward_branch).")
        return self.reward_scores(split_hidden, input_ids, attention_mask, self.reward_branch, response_start)

    def reward_scores(
        self, split_hidden, input_ids, attention_mask, branch: RewardBranch, response_start=None, logprob_rows: int = 0
    ):
        """Scores of `branch` (frozen or training) on top of the cached split hidden state.

        Pooled as the branch says (model/reward_branch.py's pooled_scores).

        `logprob_rows=n`: also the token log-probs (n, T-1) of the first n rows' responses as the model's
        LM head reads the branch's hidden states (the branch's own norm applied), for GRM's language-model
        regulariser (train/reward_model.py); returns (scores, log-probs) then."""
        attention_mask = _default_mask(input_ids, attention_mask)
        position_ids = position_ids_from_mask(attention_mask)
        hidden = self._branch_hidden(split_hidden, input_ids, attention_mask, position_ids, branch.layers, branch.norm)
        scores = pooled_scores(branch, hidden, attention_mask, response_start)
        if not logprob_rows:
            return scores
        if response_start is None:
            raise ValueError("the branch's log-probs need response_start, the column where the responses begin.")
        rows = slice(0, logprob_rows)
        logprobs, _ = self._logprobs(
            hidden[rows],
            input_ids[rows],
            attention_mask[rows],
            output_embeddings(self.model),
            1.0,
            logprobs_from=response_start - 1,
        )
        return scores, logprobs

    @torch.no_grad()
    def split_hidden_states(self, input_ids, attention_mask=None) -> torch.Tensor:
        """Only the frozen bottom of the trunk: the hidden state entering the top layers."""
        attention_mask = _default_mask(input_ids, attention_mask)
        if self.full_model:
            raise UnsupportedModelError("with the whole model training there is no frozen split.")
        return self._trunk_and_policy(input_ids, attention_mask, position_ids_from_mask(attention_mask), stop=True)[1]

    @property
    def has_frozen_split(self) -> bool:
        """Whether frozen layers run below the split, so their output can be recorded and reused."""
        return not self.full_model and self.split_index > 0

    @contextmanager
    def recording_split(self):
        """Within it, every pass of the decoder (each step of `generate`: the prompt, then
        one token per row) appends its split hidden state (B, T, H) to the yielded list."""
        steps: list[torch.Tensor] = []
        handle = split_hook(self.arch.layers, self.split_index, steps.append)
        try:
            yield steps
        finally:
            handle.remove()

    @torch.no_grad()
    def split_of_next_token(self, tokens, attention_mask, past_key_values) -> torch.Tensor:
        """The split hidden state (B, 1, H) of one more token per row after a cached prefix
        (what `generate` leaves): the bottom layers only. `attention_mask` covers the prefix
        and `tokens` (B, 1)."""
        captured = []

        def receive(hidden):
            captured.append(hidden)
            raise StopTrunk

        position_ids = attention_mask.long().sum(-1, keepdim=True) - 1
        handle = split_hook(self.arch.layers, self.split_index, receive)
        try:
            self.model(
                input_ids=tokens,
                attention_mask=attention_mask,
                position_ids=position_ids,
                use_cache=True,
                **cache_argument(self.model, past_key_values),
            )
        except StopTrunk:
            pass
        finally:
            handle.remove()
        return captured[0]

    def generate(self, *args, **kwargs):
        """Sample from the policy with transformers' `generate` (KV cache and all)."""
        return self.model.generate(*args, **kwargs)

    def forward(self, *args, **kwargs) -> HydraOutput:
        return self.forward_hydra(*args, **kwargs)

    # ------------------------------------------------------------------ internals
    def _policy_outputs(
        self, hidden, input_ids, attention_mask, return_entropy, return_logits, temperature, logprobs_from=0
    ):
        head = output_embeddings(self.model)
        logprobs, entropy = self._logprobs(
            hidden, input_ids, attention_mask, head, temperature, return_entropy, logprobs_from
        )
        values = self.value_head(hidden).masked_fill(attention_mask == 0, 0.0) if self.value_head is not None else None
        out = HydraOutput(logprobs=logprobs, values=values, entropy=entropy)
        if return_logits:
            out.logits = self._logits_transform(head(hidden))
        return out

    def _logprobs(self, hidden, input_ids, attention_mask, head, temperature, with_entropy=False, logprobs_from=0):
        logprobs, entropy = token_logprobs(
            hidden[:, logprobs_from:-1],
            input_ids[:, logprobs_from + 1 :],
            head,
            self._logits_transform,
            temperature=temperature,
            with_entropy=with_entropy,
            chunk_tokens=self.logprob_chunk_tokens,
        )
        if logprobs_from:
            logprobs = nn.functional.pad(logprobs, (logprobs_from, 0))
            entropy = nn.functional.pad(entropy, (logprobs_from, 0)) if entropy is not None else None
        # torch.where, not multiplication: a padded position may hold NaN from a fully masked
        # attention row, and NaN * 0 is NaN.
        target_is_pad = attention_mask[:, 1:] == 0
        logprobs = torch.where(target_is_pad, torch.zeros_like(logprobs), logprobs)
        if entropy is not None:
            entropy = torch.where(target_is_pad, torch.zeros_like(entropy), entropy)
        return logprobs, entropy

    def _decoder_hidden(self, decoder, input_ids, attention_mask, position_ids):
        out = decoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
        return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]

    def _trunk_and_policy(self, input_ids, attention_mask, position_ids, stop: bool = False):
        """One pass of the model's own decoder; the hidden state entering the first top layer
        (or leaving the last layer, for N = 0) is captured on the way."""
        if self.full_model:
            return self._decoder_hidden(self.arch.decoder, input_ids, attention_mask, position_ids), None
        captured = {}

        def receive(hidden):
            captured["hidden"] = hidden
            if stop:
                raise StopTrunk

        handle = split_hook(self.arch.layers, self.split_index, receive)
        try:
            hidden = self._decoder_hidden(self.arch.decoder, input_ids, attention_mask, position_ids)
        except StopTrunk:
            hidden = None
        finally:
            handle.remove()
        return hidden, captured["hidden"]

    # The reference's final hidden state and its output head, one way per kind of hydra (__init__ picks it).
    def _reference_with_adapters_off(self, split_hidden, input_ids, attention_mask, position_ids, packing):
        with self.peft_model.disable_adapter():
            hidden = self._branch_hidden(split_hidden, input_ids, attention_mask, position_ids, None, None, packing)
        return hidden, output_embeddings(self.model)

    def _reference_of_model_copy(self, split_hidden, input_ids, attention_mask, position_ids, packing):
        ref = self.reference_model
        return self._decoder_hidden(locate(ref).decoder, input_ids, attention_mask, position_ids), output_embeddings(
            ref
        )

    def _reference_of_top_copy(self, split_hidden, input_ids, attention_mask, position_ids, packing):
        hidden = self._branch_hidden(
            split_hidden, input_ids, attention_mask, position_ids, self.ref_layers, self.ref_norm, packing
        )
        return hidden, self.ref_lm_head if self.ref_lm_head is not None else output_embeddings(self.model)

    def _prompt_packing(self, split_hidden, input_ids, attention_mask, position_ids, shared_prompt_width):
        """How these rows pass their shared prompts once (model/shared_prompt.py), or None: no
        `shared_prompt_width`, no cached split to pack, a model that failed the probe, or nothing to gain."""
        if not shared_prompt_width or split_hidden is None or not self.shares_prompts:
            return None
        return plan_packing(
            self.model.config, input_ids, attention_mask, position_ids, shared_prompt_width, split_hidden.dtype
        )

    def _branch_hidden(self, split_hidden, input_ids, attention_mask, position_ids, layers, norm, packing=None):
        """Final hidden state of a top-layer branch (None = the policy's own) on a cached split; with
        a `packing` (_prompt_packing), over the packed rows, scattered back to the rows."""
        if packing is None:
            with self._branch_in_place(split_hidden, layers, norm):
                return self._decoder_hidden(self.arch.decoder, input_ids, attention_mask, position_ids)
        with self._branch_in_place(packing.pack(split_hidden), layers, norm):
            packed = self._decoder_hidden(
                self.arch.decoder, packing.input_ids, packing.attention_mask, packing.position_ids
            )
        return packing.unpack(packed)

    @contextmanager
    def _branch_in_place(self, split_hidden, layers, norm):
        layer_list = self.arch.layers
        original_layers = list(layer_list)
        original_norm = self.arch.final_norm
        try:
            for index in range(self.split_index):
                inject = split_hidden if index == self.split_index - 1 else None
                layer_list[index] = SkipLayer(original_layers[index], inject, self._layer_tuple_len)
            if layers is not None:
                for offset, layer in enumerate(layers):
                    layer_list[self.split_index + offset] = layer
            if norm is not None:
                set_path(self.arch.decoder, self.arch.norm_path, norm)
            yield
        finally:
            for index, layer in enumerate(original_layers):
                layer_list[index] = layer
            if norm is not None:
                set_path(self.arch.decoder, self.arch.norm_path, original_norm)

    def _verify(self) -> None:
        """The checks on a probe every new hydra runs (model/probe.py): refuses a model whose passes
        hydrappo cannot reproduce, and decides whether rows that share a prompt may pass it once."""
        verify(self)


def _default_mask(input_ids, attention_mask):
    return torch.ones_like(input_ids) if attention_mask is None else attention_mask


def _untie_output_embeddings(model: nn.Module) -> None:
    head = output_embeddings(model)
    head.weight = nn.Parameter(head.weight.detach().clone())
    # Stop transformers from re-tying on save/load or resize.
    for config in {id(c): c for c in (model.config, model.config.get_text_config())}.values():
        config.tie_word_embeddings = False


def _check_model_usable(model: nn.Module) -> None:
    if not isinstance(model, nn.Module) or not hasattr(model, "config"):
        raise TypeError(
            f"HydraModel wraps a transformers causal LM (PreTrainedModel), got {type(model).__name__}. "
            "Use HydraModel.from_pretrained(path) to load one."
        )
    params = list(model.parameters())
    if not params:
        raise UnsupportedModelError(f"{type(model).__name__} has no parameters.")
    if any(p.device.type == "meta" for p in params):
        raise UnsupportedModelError(
            "some of the model's weights are on the meta device (not loaded). Load the model fully, e.g. "
            "AutoModelForCausalLM.from_pretrained(path) without device_map='meta' or init_empty_weights."
        )
    devices = {p.device for p in params}
    if len(devices) > 1:
        raise UnsupportedModelError(
            f"the model is spread over several devices ({sorted(map(str, devices))}); hydrappo needs it on one "
            "device. Load it without device_map and move it with .to(device)."
        )
    dtypes = {p.dtype for p in params}
    if any(not dtype.is_floating_point for dtype in dtypes):
        raise UnsupportedModelError(
            f"the model holds non-float weights ({sorted(map(str, dtypes))}), e.g. a quantised model; its top "
            "layers cannot train. Load it in float32/bfloat16."
        )
    if torch.float16 in dtypes and params[0].device.type == "cpu":
        raise UnsupportedModelError(
            "float16 weights on the CPU: PyTorch's CPU kernels do not support half-precision training well. "
            "Load the model with torch_dtype=torch.float32 (or bfloat16)."
        )
