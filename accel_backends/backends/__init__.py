"""Built-in backends. Each module is a plugin: it implements ``register_backends`` like a third-party one."""

BUILTIN_PLUGIN_MODULES = (
    "accel_backends.backends.cpu",
    "accel_backends.backends.cuda",
    "accel_backends.backends.npu",
)
