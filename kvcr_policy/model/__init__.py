"""The model a pool is sized for: its page shape, from a preset, its dimensions or a model's
own ``config.json``.

- :mod:`.shape`: :class:`~.shape.ShapeOptions` (what ``--geometry``, ``--model-config``, the
  dimension options and ``--tp`` say) resolved into a :class:`~.shape.ModelShape`, shared by
  ``plan``, ``bench`` and ``tune``;
- :mod:`.hf_config`: a Hugging Face ``config.json`` read into those dimensions (GQA heads, head
  dim, dtype, an MLA latent).
"""
