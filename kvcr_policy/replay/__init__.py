"""``kvcr-policy replay``: a request trace through a real engine, without and with the L3 tier.

- :mod:`.setup`: the checked set-up; :mod:`.cli`: the command's options.
- :mod:`.prompts`: the trace's requests as token-id prompts.
- :mod:`.vllm_engine` (parent) and :mod:`.vllm_run` (one run per process): a real vLLM engine
  on the CPU with the tiny model of :mod:`.vllm_model` and the kvcr_policy connector.
- :mod:`.sglang_engine`, :mod:`.sglang_stack`, :mod:`.sglang_scheduler`: SGLang's real
  ``HiCacheController`` on the CPU, the scheduler's part played here, TTFT with a calibrated
  prefill stand-in (:mod:`.prefill`).
- :mod:`.figures`: percentiles and the comparison; :mod:`.report`: the text; :mod:`.command`.
"""

from __future__ import annotations

__all__: list[str] = []
