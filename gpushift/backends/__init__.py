"""Backends: what gpushift knows about each kind of inference server, and how it talks to one.

One module a kind, behind one small interface (power-profiles-daemon's drivers):

* ``kind`` -- :class:`Kind`, everything one kind knows: its endpoints (version, metrics), how it
  reads its requests in flight from the metrics page (the drain), its warm-up request and API-key
  variable, the model files it loads (the pre-warm), its doctor rules;
* ``vllm``, ``llama``, ``generic`` -- one :class:`Kind` each;
* ``kinds`` -- the table: the config's ``kind = "..."`` → its :class:`Kind`.  Everything that
  depends on a kind asks it (the config reader, the probe, the warm-up, the pre-warm plan, the
  doctor);
* ``rules`` -- the vocabulary a kind's doctor rules speak (``Finding``, the stable codes,
  ``Launch``, ``KindRules``), below the config and the doctor so a kind's module can use it.

Adding a kind is writing ``backends/<kind>.py`` with its ``KIND = Kind(...)`` and one line for it
in the table of ``kinds.py``.

Shared by every kind: the command-line parser (``cmdline``), the metrics pages' readers
(``gauges``), the warm-up request (``warmup``), and the HTTP side (``httpget``, ``probe``,
``warmup_http``, ``version``): health, in-flight requests, the warm-up exchange, the version.
"""
