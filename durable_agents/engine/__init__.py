"""The durable engine: plain Python, no Django, Celery or ninja (a test enforces it).

Its modules form layers, every import pointing down (``tests/unit/test_engine_purity.py``
fails on a cycle):

* vocabulary: ``errors`` (every error, with its code and HTTP status hint), ``names`` (every
  journal name and shared record body), ``records`` (the encoding), ``ports`` (the ``Store``
  protocol and the rows it speaks), ``model``, ``redact``, ``failpoints``;
* rules: ``fingerprint``, ``tools``, ``journal``, ``transcript``, ``retry``, ``runtime``
  (the wiring the glue hands in), ``identity``, ``leases``, ``approvals`` (policies,
  signatures, the tally), ``definition`` (an agent's definition), ``registry``, ``steps``
  (a run read as steps; compare);
* ``loop``: the driver;
* ``replay_model`` (a model answering from a journal), ``replay`` (today's code against a
  recorded run) and ``export`` (the JSON-lines export format), read-only beside the loop;
* ``commands/``: what people and processes do to runs, one module per concept;
* ``agent``: ``Agent``, the definition with its facade (``run``, ``start``, ``session``),
  the only module on top of the commands.

``memstore`` is the in-memory ``Store`` (shipped to users as ``durable_agents.testing``).
"""
