"""Prometheus metrics: what they are (collector), where they go (the /metrics listener and
node_exporter's textfile), and the daemon's hook that starts them (exporter)."""
