"""The names of systemd's D-Bus API that gpushift calls (org.freedesktop.systemd1(5))."""

SYSTEMD_BUS_NAME = "org.freedesktop.systemd1"
SYSTEMD_PATH = "/org/freedesktop/systemd1"
MANAGER_IFACE = "org.freedesktop.systemd1.Manager"
UNIT_IFACE = "org.freedesktop.systemd1.Unit"
SERVICE_IFACE = "org.freedesktop.systemd1.Service"
JOB_IFACE = "org.freedesktop.systemd1.Job"
PROPS_IFACE = "org.freedesktop.DBus.Properties"
