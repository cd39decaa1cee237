"""Console scripts, one module each: ``train`` (agentloop-train), ``sft`` (agentloop-sft),
``rollout`` (agentloop-rollout), ``serve`` (agentloop-serve), ``models`` (agentloop-models),
``traces`` (agentloop-traces); ``common`` (what they share: the Hydra commands' start-up and
one-line errors) and ``flags`` (argparse flags generated from a typed dataclass).

They compose every layer, so they sit at the top: nothing else in the project imports them.
Each runs as ``python -m trainer.cli.<name>`` too.
"""
