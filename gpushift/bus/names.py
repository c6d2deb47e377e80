"""The names of gpushift's D-Bus interface (the contract is gpushift/bus/org.gpushift.Switcher1.xml).

Apart from the service and the clients so that a light client (``gpushift status``) can name the
daemon without importing pydbus or PyGObject.
"""

BUS_NAME = "org.gpushift.Switcher1"
OBJECT_PATH = "/org/gpushift/Switcher1"
INTERFACE = "org.gpushift.Switcher1"
