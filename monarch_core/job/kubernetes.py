"""``monarch_core.job.kubernetes``: the reference's ``monarch.job.kubernetes``
(``KubernetesJob``) has no counterpart here -- there is no Kubernetes
scheduler.  Importing this module raises ``ImportError`` naming the jobs
that exist (docs/job.md)."""

from monarch_core.job import AVAILABLE

raise ImportError(
    "monarch_core.job.kubernetes: KubernetesJob is not available (there is no Kubernetes scheduler here). The jobs "
    f"available are {', '.join(AVAILABLE)} in monarch_core.job (docs/job.md)"
)
