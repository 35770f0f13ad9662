"""RayJob target: a plan becomes a KubeRay RayJob custom resource, and the RayJob's status its job state.

``dry_run(plan)`` renders the RayJob (pure: it reads the kubeconfig or, with ``--cluster``, the RayCluster,
and changes neither the plan nor the target); ``submit(request)`` applies exactly that manifest, server-side,
under a name chosen once per submission, so a retried submit finds its RayJob instead of starting the job
twice.
"""
from __future__ import annotations

import datetime as _dt
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import raytrain
from raytrain import flight_recorder
from raytrain.capacity import Node
from raytrain.clusters.k8s_auth import ClusterGuard
from raytrain.clusters.k8s_client import KubeConnection, NotFound, RayObjects, auth_options_known
from raytrain.clusters.k8s_manifests import (
    KUBERAY_AUTH_VERSION,
    MANAGED_BY,
    STORAGE_ANNOTATION,
    SUBMITTER_CONTAINER,
    auth_secret_name,
    require_secret_env,
    uses_hand_set_auth,
    security_manifests,
    nodes_from_spec,
    rayjob_name,
    render_raycluster_spec,
    render_rayjob,
    worker_pods_needed,
)
from raytrain.clusters.k8s_names import check_name
from raytrain.clusters.profiles import K8sProfile
from raytrain.config.plan import Plan
from raytrain.errors import ClusterError, ConfigError, RaytrainError
from raytrain.events import JobFacts
from raytrain.status import JobInfo, job_state, rayjob_state
from raytrain.targets.base import (
    RUNTIME_ENV_VARS,
    tuning_env_vars,
    SECRET_EXCLUDES,
    STOP_WAIT_S,
    JobHandle,
    Request,
    Target,
    allocator_env_vars,
    mask_env,
    shipped_plan,
)
from raytrain.targets.ray_jobs_api import with_default_storage

ENTRYPOINT_MODULE = "raytrain.runtime.driver.entrypoint"
# How often `follow` reads the RayJob and its submitter log (a few API calls each): a RayJob's status moves no
# faster than KubeRay reconciles it.
POLL_S = 2.0


@dataclass
class K8sRequest(Request):
    """A Request plus what Kubernetes gets: the namespace and the exact manifests (or a port-forward)."""

    namespace: str = ""
    manifests: list[dict[str, Any]] = field(default_factory=list)
    port_forward: dict[str, Any] | None = None

    def masked(self) -> "K8sRequest":
        """As Request.masked, and the same values masked in the RayJob's runtimeEnvYAML."""
        import copy
        import dataclasses as dc

        import yaml

        out = super().masked()
        keys = set((self.plan.env if self.plan else {}) or {})
        manifests = copy.deepcopy(self.manifests)
        for m in manifests:
            spec = m.get("spec") or {}
            if spec.get("runtimeEnvYAML"):  # --env values masked, RAYTRAIN_PLAN redacted
                env = mask_env(yaml.safe_load(spec["runtimeEnvYAML"]), keys)
                spec["runtimeEnvYAML"] = yaml.safe_dump(env, sort_keys=True, default_flow_style=False)
        return dc.replace(out, manifests=manifests)

    def to_text(self) -> str:
        """The exact manifests (YAML) a submit applies; for the port-forward path (nothing is applied) the
        port-forward and the Jobs API submission, as one YAML document."""
        from raytrain.clusters.k8s_manifests import to_yaml

        if not self.port_forward:
            spec = self.manifests[0].get("spec") or {} if self.manifests else {}
            note = "" if spec.get("clusterSelector") or not self.manifests else (
                f"# raytrain also creates Secret {auth_secret_name(self.manifests[0]['metadata']['name'])} with a "
                "fresh Ray auth token (not shown: pods read it through secretKeyRef)\n"
            )
            return note + to_yaml(self.manifests)
        pf = self.port_forward
        kubectl = f"kubectl port-forward -n {pf['namespace']} svc/{pf['service']} :{pf['remote_port']}"
        doc = {
            "portForward": {**pf, "kubectl": kubectl},
            "jobSubmission": {
                "address": self.address,
                "submission_id": self.submission_id,
                "entrypoint": self.entrypoint,
                "entrypoint_num_cpus": self.entrypoint_num_cpus,
                "metadata": self.metadata,
                "runtime_env": self.runtime_env,
            },
        }
        return (
            "# Nothing is applied to the cluster: raytrain port-forwards to the head Service and\n"
            "# submits through the Ray Jobs API, uploading the job's folder as working_dir.\n" + to_yaml([doc])
        )


def describe_status(status: dict[str, Any] | None) -> str:
    status = status or {}
    parts = [f"deployment {status.get('jobDeploymentStatus') or 'New'}"]
    if status.get("jobStatus"):
        parts.append(f"job {status['jobStatus']}")
    if status.get("rayClusterName"):
        parts.append(f"cluster {status['rayClusterName']}")
    text = ", ".join(parts)
    if status.get("message"):
        text += f": {status['message']}"
    return text


def _timestamp(value: Any) -> float | None:
    if not value:
        return None
    try:
        return _dt.datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _contains(actual: Any, wanted: Any) -> bool:
    """Everything in ``wanted`` is in ``actual`` (the server may add defaults, never change ours)."""
    if isinstance(wanted, dict):
        return isinstance(actual, dict) and all(_contains(actual.get(k), v) for k, v in wanted.items())
    if isinstance(wanted, list):
        return isinstance(actual, list) and len(actual) == len(wanted) and all(map(_contains, actual, wanted))
    return actual == wanted


def job_metadata(plan: Plan) -> dict[str, str]:
    return {
        "raytrain": raytrain.__version__,
        "name": plan.name,
        "job": plan.job_module,
        "workers": str(plan.scaling.num_workers),
        "zero": str(plan.zero),
        "precision": plan.precision,
    }


STARTING_DEPLOYMENTS = ("", "New", "Initializing", "Waiting")  # KubeRay has not started the Ray job yet
INIT_TIMEOUT_S = 900.0  # how long `submit`/`jobs logs -f` follow a RayJob whose cluster does not come up


class KubeRayJobTarget(Target):
    """``submit --k8s --rayjob``: the job's code is already on the cluster (image or remote URI)."""

    kind = "kuberay"
    init_timeout_s = INIT_TIMEOUT_S

    def __init__(
        self,
        conn: KubeConnection,
        *,
        profile: K8sProfile,
        namespace: str | None = None,
        ray_cluster: str | None = None,
        working_dir: str | None = None,
        submission_id: str | None = None,
        env_from_secret: dict[str, tuple[str, str]] | None = None,
        python: str = "python",
        poll_s: float | None = None,
    ):
        self.conn = conn
        self.profile = profile
        self._namespace_flag = namespace
        self.ray_cluster = ray_cluster  # clusterSelector mode when set; else the RayJob brings its own cluster
        self.working_dir = working_dir
        self.submission_id = submission_id
        self.env_from_secret = dict(env_from_secret or {})  # with --cluster: checked against its pods (dry_run)
        self.python = python
        self.poll_s = POLL_S if poll_s is None else poll_s
        self._namespace: str | None = None
        self._cluster_obj: dict | None = None
        if ray_cluster is not None:
            check_name("RayCluster", ray_cluster, flag="--cluster")
        if submission_id is not None:
            check_name("RayJob", submission_id, flag="--submission-id")

    # -- where ------------------------------------------------------------------------------------------
    @property
    def namespace(self) -> str:
        if self._namespace is None:
            self._namespace = self.conn.namespace(self._namespace_flag, self.profile.namespace)
        return self._namespace

    @property
    def address(self) -> str:
        return f"k8s namespace {self.namespace}"

    @property
    def rayjobs(self) -> RayObjects:
        return RayObjects(self.conn.kube, "rayjobs", self.namespace)

    def _existing_cluster(self) -> dict:
        if self._cluster_obj is None:
            from raytrain.clusters.raycluster import RayClusters

            self._cluster_obj = RayClusters(self.conn, self.namespace).require(self.ray_cluster)
        return self._cluster_obj

    def nodes(self, request: Request | None = None) -> list[Node]:
        """Ray's view of the cluster the job will run on, from its spec (at full size): --cluster's, else the
        one the request's RayJob brings (sized for the job), else the profile's."""
        if self.ray_cluster:
            return nodes_from_spec(self._existing_cluster().get("spec") or {})
        if isinstance(request, K8sRequest) and request.manifests:
            own = request.manifests[0].get("spec", {}).get("rayClusterSpec")
            if own:
                return nodes_from_spec(own)
        return nodes_from_spec(render_raycluster_spec(self.profile))

    def reconnect_flags(self) -> list[str]:
        return ["--k8s", "--namespace", self.namespace]

    # -- building the request (no side effects) ---------------------------------------------------------
    def _working_dir(self) -> str:
        wd = self.working_dir or self.profile.rayjob.working_dir
        if not wd:
            raise ConfigError(
                "--rayjob runs code that is already on the cluster: give --working-dir with a remote URI "
                "(s3://..., gs://..., https://.../code.zip) or a folder baked into the image (/app); "
                "or drop --rayjob to upload the job's folder through a port-forward to a running RayCluster",
                flag="--working-dir",
            )
        if "://" not in wd and not wd.startswith("/"):
            raise ConfigError(
                f"--working-dir {wd}: the cluster cannot see this machine's folders; use a remote URI "
                "(s3://, gs://, https://...zip) or an absolute path inside the image",
                flag="--working-dir",
            )
        return wd

    def default_storage(self) -> str | None:
        if self.ray_cluster:
            try:
                annotations = self._existing_cluster().get("metadata", {}).get("annotations") or {}
            except ClusterError:
                annotations = {}
            if annotations.get(STORAGE_ANNOTATION):
                return annotations[STORAGE_ANNOTATION]
        return self.profile.storage.path

    def runtime_env(self, plan: Plan, run_name: str, working_dir: str) -> dict[str, Any]:
        extra = dict(self.profile.rayjob.runtime_env or {})
        env_vars = {
            **RUNTIME_ENV_VARS,
            **tuning_env_vars(),
            **allocator_env_vars(plan, jemalloc=False),  # the pods start Ray from their image
            **flight_recorder.env_vars(plan, run_name, {*(extra.get("env_vars") or {}), *plan.env}),
            **(extra.pop("env_vars", None) or {}),  # the profile's, then the job's --env, win
            **plan.env,
            "RAYTRAIN_PLAN": shipped_plan(plan),
            "RAYTRAIN_RUN_NAME": run_name,
        }
        runtime_env: dict[str, Any] = {**extra, "working_dir": working_dir, "env_vars": env_vars}
        if "://" not in working_dir:  # a folder in the image: the submitter zips it, honouring excludes
            runtime_env["excludes"] = list(SECRET_EXCLUDES)
        return runtime_env

    def dry_run(self, plan: Plan) -> K8sRequest:
        working_dir = self._working_dir()
        if self.ray_cluster and self.env_from_secret:
            require_secret_env(self._existing_cluster(), self.env_from_secret, "--env-from-secret")
        plan = with_default_storage(plan, self.default_storage())
        name = self.submission_id or rayjob_name(plan.name)
        worker_replicas = 0
        if not self.ray_cluster:
            worker_replicas = worker_pods_needed(
                self.profile, plan.scaling.num_workers, plan.scaling.resources_per_worker
            )
        entrypoint = f"{self.python} -m {ENTRYPOINT_MODULE}"
        runtime_env = self.runtime_env(plan, name, working_dir)
        metadata = job_metadata(plan)
        manifest = render_rayjob(
            name=name,
            namespace=self.namespace,
            entrypoint=entrypoint,
            runtime_env=runtime_env,
            metadata=metadata,
            profile=self.profile,
            cluster=self.ray_cluster,
            worker_replicas=worker_replicas,
            secret_env=self.env_from_secret,
        )
        return K8sRequest(
            target=self.kind,
            address=self.address,
            submission_id=name,
            run_name=name,
            entrypoint=entrypoint,
            runtime_env=runtime_env,
            metadata=metadata,
            plan=plan,
            namespace=self.namespace,
            manifests=[manifest, *([] if self.ray_cluster else security_manifests(name, self.namespace, self.profile))],
        )

    # -- talking to the API server ----------------------------------------------------------------------
    def submit(self, request: Request) -> JobHandle:
        if not isinstance(request, K8sRequest) or not request.manifests:
            raise ConfigError("a RayJob submit needs the request from this target's dry_run")
        manifest = request.manifests[0]
        name = manifest["metadata"]["name"]
        rayjobs = RayObjects(self.conn.kube, "rayjobs", request.namespace)
        existing = rayjobs.get(name)
        if existing is not None:
            if _contains(existing.get("spec"), manifest["spec"]):
                # The same submission again (a retry): it already runs, never start it twice.
                return JobHandle(self.kind, request.address, name, request.metadata.get("name", ""))
            raise ClusterError(
                f"RayJob {name!r} already exists in namespace {request.namespace} with a different spec; "
                "pick another --submission-id (or leave it out for a fresh one)"
            )
        if self.ray_cluster:
            if uses_hand_set_auth(self._existing_cluster()):  # also one clear line if the RayCluster is gone
                raise ConfigError(
                    f"--rayjob --cluster {self.ray_cluster}: this RayCluster requires a Ray token but its spec has no "
                    f"authOptions, so the KubeRay operator cannot read its jobs' status; re-create it with `raytrain "
                    f"cluster up --k8s` on KubeRay >= {KUBERAY_AUTH_VERSION}, or leave out --rayjob (raytrain's "
                    "port-forward sends the token)", flag="--rayjob",
                )
            rayjobs.apply(manifest, force=False)
        else:  # its own cluster: its own token Secret and NetworkPolicy, deleted with the RayJob
            if not auth_options_known(self.conn.kube, "rayjobs"):  # before anything is created
                raise self._old_kuberay()
            guard = ClusterGuard(self.conn.kube, request.namespace)
            guarded = guard.ensure(name, self.profile)
            try:
                obj = rayjobs.apply(manifest, force=False)
            except ClusterError as exc:  # a CRD this user could not read, from before authOptions
                if "authOptions" not in str(exc):
                    raise
                guard.delete(name)
                raise self._old_kuberay() from None
            if guarded:
                guard.adopt(name, obj)
        return JobHandle(self.kind, request.address, name, request.metadata.get("name", ""))

    def _old_kuberay(self) -> ConfigError:
        return ConfigError(
            f"--rayjob: the KubeRay on {self.conn.kube.server} has no spec.authOptions (KubeRay >= "
            f"{KUBERAY_AUTH_VERSION} needed), so its operator could not authenticate to the job's token-protected "
            "Ray cluster and the RayJob would never finish; upgrade KubeRay, or leave out --rayjob: `raytrain "
            "cluster up --k8s`, then `raytrain submit JOB --k8s --cluster NAME` (raytrain's port-forward)",
            flag="--rayjob",
        )

    def _get(self, job_id: str) -> dict:
        obj = self.rayjobs.get(job_id)
        if obj is None:
            raise ClusterError(
                f"no RayJob {job_id!r} in namespace {self.namespace} (see `raytrain jobs list --k8s`)"
            )
        return obj

    def _info(self, obj: dict, facts: JobFacts | None, *, log_read: bool = True) -> JobInfo:
        meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
        state = job_state(rayjob_state(status), facts if log_read else None)
        message = status.get("message") or ""
        reason = status.get("reason") or ""
        if reason and reason not in message:
            message = f"{reason}: {message}" if message else reason
        return JobInfo(
            job_id=meta.get("name", ""),
            name=(spec.get("metadata") or {}).get("name", ""),
            state=state,
            target=self.kind,
            address=self.address,
            entrypoint=spec.get("entrypoint", ""),
            message=message,
            start_time=_timestamp(status.get("startTime")) or _timestamp(meta.get("creationTimestamp")),
            end_time=_timestamp(status.get("endTime")),
            metadata={
                **dict(spec.get("metadata") or {}),
                "deployment": status.get("jobDeploymentStatus") or "",
                "cluster": status.get("rayClusterName") or (spec.get("clusterSelector") or {}).get("ray.io/cluster", ""),
            },
            facts=facts,
        )

    def _submitter_log(self, name: str) -> tuple[str, str | None]:
        """(the log of KubeRay's submitter pod (it follows the Ray job's log), why it could not be read). ""
        and None where there is no such pod yet; "" and the cluster's error where reading it failed."""
        kube = self.conn.kube
        try:
            pods = kube.call(
                f"list the submitter pods of RayJob {name}", kube.core.list_namespaced_pod, self.namespace,
                label_selector=f"job-name={name}",
            )
            items = sorted(
                pods.get("items") or [], key=lambda p: (p.get("metadata") or {}).get("creationTimestamp") or ""
            )
            if not items:
                return "", None
            pod = items[-1]["metadata"]["name"]
            resp = kube.call(
                f"read the log of pod {pod}", kube.core.read_namespaced_pod_log, pod, self.namespace,
                container=SUBMITTER_CONTAINER, raw=True,
            )
        except NotFound:
            return "", None  # the pod went away between listing and reading: no log yet
        except ClusterError as exc:  # no permission to read pods, the API server failing: say so
            return "", f"cannot read the job's log: {exc}"
        return (resp if isinstance(resp, str) else ""), None

    def status(self, job_id: str, *, with_facts: bool = True) -> JobInfo:
        obj = self._get(job_id)
        if not with_facts:
            return self._info(obj, None)
        log, problem = self._submitter_log(job_id)
        # No log (no submitter pod yet, or pods cannot be read here): the RayJob's status alone decides.
        info = self._info(obj, JobFacts.from_lines(log.splitlines()), log_read=bool(log))
        if problem:
            info.problems.append(f"{problem} (the state is the RayJob's alone)")
        return info

    def logs(self, job_id: str) -> str:
        self._get(job_id)
        text, problem = self._submitter_log(job_id)
        if problem:
            raise ClusterError(f"RayJob {job_id}: {problem}")
        if not text:
            return (
                f"raytrain: no log for RayJob {job_id} yet: KubeRay's submitter pod (label job-name={job_id}) "
                "has not written one\n"
            )
        return text

    def follow(self, job_id: str, on_text: Callable[[str], None]) -> None:
        """Status changes (one line each) and the submitter's log, until the RayJob ends. A log that cannot
        be read is said once (and again if it becomes readable and then fails again)."""
        last, seen, said = None, 0, None
        since = time.monotonic()  # when the RayJob entered its current starting status
        while True:
            obj = self._get(job_id)
            status = obj.get("status") or {}
            line = describe_status(status)
            if line != last:
                on_text(f"raytrain: RayJob {job_id}: {line}\n")
                last, since = line, time.monotonic()
            self._check_not_stuck(job_id, status, time.monotonic() - since)
            text, problem = self._submitter_log(job_id)
            if problem != said and problem:
                on_text(f"raytrain: RayJob {job_id}: {problem}\n")
            said = problem
            if len(text) < seen and not problem:
                seen = 0  # a new submitter pod (retry)
            if len(text) > seen:
                on_text(text[seen:])
                seen = len(text)
            if rayjob_state(status).terminal:
                return
            time.sleep(self.poll_s)

    def _check_not_stuck(self, job_id: str, status: dict, seconds: float) -> None:
        """A RayJob whose Ray cluster does not come up (pods that cannot be scheduled or pulled) would be
        followed for ever: give up after ``init_timeout_s`` saying where to look; the RayJob stays."""
        deployment = status.get("jobDeploymentStatus") or ""
        if deployment not in STARTING_DEPLOYMENTS or status.get("jobStatus") or seconds <= self.init_timeout_s:
            return
        cluster = status.get("rayClusterName") or self.ray_cluster or job_id
        raise RaytrainError(
            f"RayJob {job_id} has been {deployment or 'New'} for {seconds:.0f} s: its Ray cluster {cluster} has not "
            f"come up (`kubectl get pods -n {self.namespace} -l ray.io/cluster={cluster}` and `kubectl describe pod` "
            f"say why: resources, image pull, volumes). The RayJob is still there; `raytrain jobs stop {job_id} "
            "--k8s` removes it"
        )

    def stop(self, job_id: str) -> bool:
        """Suspend a RayJob that owns its cluster (KubeRay stops the job and frees the pods); delete one
        on a shared RayCluster (KubeRay's finalizer stops the Ray job). False if it had already ended."""
        obj = self._get(job_id)
        if rayjob_state(obj.get("status")).terminal:
            return False
        spec = obj.get("spec") or {}
        if spec.get("clusterSelector") or not spec.get("shutdownAfterJobFinishes"):
            return self.rayjobs.delete(job_id)
        self.rayjobs.merge_patch(job_id, {"spec": {"suspend": True}})
        return True

    def stop_and_wait(self, job_id: str, *, wait: bool = True, timeout_s: float = STOP_WAIT_S) -> str:
        before = self.status(job_id, with_facts=False)
        if not self.stop(job_id):
            return f"{job_id}: {before.state.value} (had already ended)"
        after = self.rayjobs.get(job_id)
        if after is None or (after.get("metadata") or {}).get("deletionTimestamp"):
            return f"{job_id}: RayJob deleted; KubeRay stops its Ray job on cluster {before.metadata.get('cluster')}"
        info = self.wait_until_ended(job_id, wait=wait, timeout_s=timeout_s)
        if wait and not info.state.terminal:
            raise RaytrainError(
                f"{job_id} is still {info.state.value} {timeout_s:.0f} s after it was suspended: KubeRay has not "
                f"stopped it (see `kubectl describe rayjob {job_id}`); run `raytrain jobs stop {job_id} --k8s` again"
            )
        return f"{job_id}: {info.state.value}" + ("" if info.state.terminal else " (stopping; not waited for)")

    def list(self) -> list[JobInfo]:
        items = self.rayjobs.list(label_selector=f"{MANAGED_BY}=raytrain")
        infos = [self._info(obj, None) for obj in items]
        return sorted(infos, key=lambda i: i.start_time or 0, reverse=True)
