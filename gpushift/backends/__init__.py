"""Backends: what gpushift knows about each kind of inference server, and how it talks to one.

The kinds' own knowledge (endpoints, warm-up request, model files, launch rules) and the HTTP client
they share: health, in-flight requests, the warm-up exchange, the version."""
