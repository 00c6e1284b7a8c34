"""The API stand-in lives in `testkit.kube_api_standin` (the benchmarks use it too); the tests import it
from here."""

from testkit.kube_api_standin import MERGE_KEYS, KubeApiStandin, merge_patch, strategic_merge_patch

__all__ = ["MERGE_KEYS", "KubeApiStandin", "merge_patch", "strategic_merge_patch"]
