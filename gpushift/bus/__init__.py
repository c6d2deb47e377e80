"""The D-Bus API of the daemon (org.gpushift.Switcher1): the service, its properties, the
argument checks, the interface's names and XML, and the two clients the CLI uses."""
