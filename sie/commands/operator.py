"""`sie operator`: the Kubernetes operator (ModelService CRs -> the control plane) and its CRD.

``sie operator run`` watches ``modelservices.sie.lmsys.org`` in the given namespaces, holds a Lease so one
replica acts, and reconciles every CR through the control plane's HTTP API (``--control-url``, operator
token in ``SIE_API_TOKEN``).  It serves ``/healthz`` (the loop is alive), ``/readyz`` and ``/metrics`` on
``--health-port``.  ``sie operator crd`` prints the CustomResourceDefinition.  docs/kubernetes.md.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import click

from sie.commands._runtime import configure_logging
from sie.kernel.settings import Settings


@click.group("operator")
def command() -> None:
    """The Kubernetes operator for ModelService resources (docs/kubernetes.md)."""


@command.command("crd")
def crd() -> None:
    """Print the ModelService CustomResourceDefinition (generated from the spec model)."""
    from sie.k8s.crd import render

    click.echo(render(), nl=False)


@command.command("resource")
@click.option("-f", "--file", "files", type=click.Path(dir_okay=False, path_type=Path), multiple=True, required=True,
              help="Spec file, either document style (repeatable).")
@click.option("-n", "--namespace", default=None, help="metadata.namespace of the resources.")
@click.option("--upload/--no-upload", default=True, show_default=True,
              help="Upload each spec's artifact and its own package first (as sie apply does) and name them by "
                   "sha256 in the resource; --no-upload keeps this machine's paths (then the CR is refused).")
@click.option("--control-url", envvar="SIE_CONTROL_URL", default=None,
              help="Upload through this control plane (token: SIE_API_TOKEN); default: straight to Kafka.")
@click.option("--timeout", type=float, default=60.0, show_default=True)
@click.pass_obj
def resource(settings: Settings, files: tuple[Path, ...], namespace: str | None, upload: bool,
             control_url: str | None, timeout: float) -> None:
    """Print ModelService resources for spec files, for `kubectl apply -f -` (what they need uploaded first).

    The resource parses back to the same spec (the CRD round trip); what SIE cannot honour is left out.
    """
    import contextlib
    import sys

    import yaml

    from sie.commands._artifacts import ApiUploader, KafkaUploader, for_cluster
    from sie.commands.spec import _load_by_file
    from sie.k8s.resource import to_resource

    uploader: ApiUploader | KafkaUploader | None = None
    if upload:
        if control_url:
            from sie.commands._api import ControlApi

            uploader = ApiUploader(ControlApi(settings, control_url, timeout=timeout))
        else:
            uploader = KafkaUploader(settings, timeout)
    docs = []
    for path, specs in _load_by_file(settings, files):
        for spec in specs:
            if uploader is not None:
                with contextlib.redirect_stdout(sys.stderr):  # progress lines stay out of the YAML
                    spec = for_cluster(spec, path, settings, uploader)
            docs.append(to_resource(spec, namespace, settings.topic_prefix))
    click.echo(yaml.safe_dump_all(docs, sort_keys=False), nl=False)


@command.command("run")
@click.option("--control-url", envvar="SIE_CONTROL_URL", required=True,
              help="The control plane's API (in the chart: http://<release>-control:8470).")
@click.option("--namespace", "namespaces", multiple=True, envvar="SIE_OPERATOR_NAMESPACES",
              help="Namespace to watch (repeatable; env: space-separated). Default: this pod's namespace.")
@click.option("--lease-namespace", envvar="POD_NAMESPACE", default=None,
              help="Namespace of the leader-election Lease (default: the first watched namespace).")
@click.option("--lease-name", default="sie-operator", show_default=True)
@click.option("--identity", envvar="POD_NAME", default=None, help="This replica's name in the Lease (default: host-pid).")
@click.option("--resync-s", type=float, default=10.0, show_default=True,
              help="Every CR is reconciled at least this often (status from the control plane).")
@click.option("--health-port", type=int, default=8081, show_default=True,
              help="/healthz, /readyz, /metrics (0 = off).")
@click.option("--health-host", default=None,
              help="Address of the health port (default: SIE_METRICS_BIND, loopback unless set; the chart sets 0.0.0.0 "
                   "in the pod so that the kubelet's probes reach it).")
@click.option("--kubeconfig", envvar="KUBECONFIG", default=None, help="Outside a pod: the kubeconfig to use.")
@click.pass_obj
def run(settings: Settings, control_url: str, namespaces: tuple[str, ...], lease_namespace: str | None,
        lease_name: str, identity: str | None, resync_s: float, health_port: int, health_host: str | None,
        kubeconfig: str | None) -> None:
    """Run the operator in the foreground; SIGTERM releases the Lease and stops."""
    import signal

    from sie.k8s.operator import ControlClient, Operator, kube_client

    configure_logging("info")
    watched = [n for item in namespaces for n in item.split()] or [lease_namespace or _pod_namespace()]
    control = ControlClient(settings, control_url)  # refuses a URL its token must not go to, before Kubernetes
    operator = Operator(kube_client(kubeconfig), control, settings,
                        namespaces=watched, identity=identity or f"{socket.gethostname()}-{os.getpid()}",
                        lease_namespace=lease_namespace or watched[0], lease_name=lease_name, resync_s=resync_s)

    def _stop(signum: int, _frame: object) -> None:
        click.echo(f"{signal.Signals(signum).name}: releasing the lease and stopping", err=True)
        operator.stop()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    if health_port:
        _serve_health(operator, health_host or settings.metrics_bind, health_port)
    operator.run()


def _pod_namespace() -> str:
    try:
        with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace", encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return "default"


def _serve_health(operator: object, host: str, port: int) -> int:
    """/healthz: the main loop ran within 60 s; /readyz: the same (a follower is ready: it waits for the
    Lease); /metrics: leadership and passes."""
    from prometheus_client import CollectorRegistry, Gauge, generate_latest

    from sie.kernel.probe_http import ProbeHandler, serve_probes

    registry = CollectorRegistry()
    leader = Gauge("sie_operator_leader", "1 while this replica holds the Lease", registry=registry)
    passes = Gauge("sie_operator_passes", "reconcile passes run by this replica", registry=registry)

    class Handler(ProbeHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            lease = getattr(operator, "lease", None)
            leading = bool(lease is not None and lease.leading)
            if self.path == "/metrics":
                leader.set(1 if leading else 0)
                passes.set(getattr(operator, "passes", 0))
                body, code, ctype = generate_latest(registry), 200, "text/plain; version=0.0.4"
            elif self.path in ("/healthz", "/readyz"):
                stuck = time.monotonic() - getattr(operator, "last_loop", time.monotonic())
                error = getattr(lease, "last_error", None)
                ok = stuck < 60
                text = f"{'ok' if ok else f'main loop stuck for {stuck:.0f}s'}: {'leader' if leading else 'follower'}"
                body = (text + (f"; {error}" if error else "") + "\n").encode()
                code, ctype = (200 if ok else 503), "text/plain"
            else:
                body, code, ctype = b"not found\n", 404, "text/plain"
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return int(serve_probes(Handler, host, port, name="sie-operator-health").server_address[1])
