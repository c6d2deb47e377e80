"""The host: systemd (units, jobs, transient hook units, the unit poll), D-Bus transport and error
names, the GPUs (NVML, the simulated provider, the /proc scan of holders), the journal, sd_notify,
/proc, what a launch looked like, and opening files that came from outside."""
