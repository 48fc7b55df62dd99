"""`--runner kubeflow`'s own options, declared (`RunOpt`) with no cluster client, so the
CLI builds its flags without the kubernetes package: the container image, namespace,
kubeconfig context and service account, which Kubernetes API the job is rendered as,
and the Kueue queue it waits in."""
from __future__ import annotations

from submit.runners.engine import RunOpt

APIS = ("tfjob", "jobset")  # the first is the default

RUNOPTS = (
    RunOpt("image", "the container image holding the trainer (see the Dockerfile "
                    "--dry-run prints)",
           prediction="the image holding mljob, which runs the workers"),
    RunOpt("namespace", "the namespace [default: the kubeconfig context's, else default]",
           prediction="the namespace [default: default]"),
    RunOpt("context", "the kubeconfig context [default: the current one]",
           flag="--kube-context", prediction="the kubeconfig context [default: the "
                                             "current one]"),
    RunOpt("api", "the job's Kubernetes API, a Kubeflow TFJob or a JobSet "
                  "(kubernetes-sigs/jobset) [default: tfjob]", choices=APIS),
    RunOpt("queue", "the Kueue LocalQueue the job waits in (the label "
                    "kueue.x-k8s.io/queue-name) [default: the config's "
                    "scheduling.queueName, else none]", metavar="NAME"),
    RunOpt("service_account", "the pods' service account"),
)
