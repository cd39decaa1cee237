"""Console scripts, one module each: ``train`` (agentloop-train), ``sft`` (agentloop-sft),
``rollout`` (agentloop-rollout), ``serve`` (agentloop-serve), ``models`` (agentloop-models),
``traces`` (agentloop-traces), and ``common`` (what they share).

They compose every layer, so they sit at the top: nothing else in the project imports them.
Each runs as ``python -m trainer.cli.<name>`` too.
"""
