"""CDI specs for the devices the plugin hands out: a pure builder (`spec`), a driver-root scan
(`scan`), an atomic writer (`writer`), the spec directory's lock (`lock`) and the glue the supervisor
calls (`publisher`: claim, write, keep, retry); CDI names and settings (`names`, pure; mapped from the
resolved config by `nvdp.daemon_settings`)."""

from nvdp.cdi.names import (
    CDI_VERSION,
    CdiSettings,
    cdi_enabled,
    qualified_name,
    spec_file_name,
)
from nvdp.cdi.publisher import CdiPublisher, PublishResult

__all__ = [
    "CDI_VERSION",
    "CdiPublisher",
    "CdiSettings",
    "PublishResult",
    "cdi_enabled",
    "qualified_name",
    "spec_file_name",
]
