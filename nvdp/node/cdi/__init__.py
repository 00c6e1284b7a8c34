"""CDI specs for the devices the plugin hands out: a pure builder (`spec`, with NVIDIA's container
edits in `edits`), what a node holds (`node_files`, found by the driver-root and dev-root scan `scan`
through the roots as this process sees them, `roots`), an atomic writer (`writer`) and the
glue the supervisor calls (`publisher`: claim the spec directory's lock, write, keep, retry);
CDI names and settings (`names`, pure; mapped from the resolved config by
`nvdp.plugins.deviceplugin.daemon_settings`).
Only the names are imported here: a plugin without a CDI strategy never loads the rest."""

from nvdp.node.cdi.names import (
    CDI_VERSION,
    CdiSettings,
    cdi_enabled,
    qualified_name,
    spec_file_name,
)

__all__ = [
    "CDI_VERSION",
    "CdiSettings",
    "cdi_enabled",
    "qualified_name",
    "spec_file_name",
]
