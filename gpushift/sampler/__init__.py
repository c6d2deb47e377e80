"""The sampler: one thread that reads the host every period (``sampler``), and the immutable picture
it publishes (``sample``), from which status, the properties and the metrics are answered."""
