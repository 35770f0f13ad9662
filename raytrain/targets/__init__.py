"""Where a plan is submitted: the local cluster (``local``), any Ray Jobs API (``ray_jobs``), KubeRay (``kuberay``:
a RayJob; ``k8s_portforward``: a RayCluster's Jobs API through a port-forward).

``base.Target`` declares what every target offers; ``factory.make_target`` builds one from options. This
package imports nothing itself, so importing one target never loads the others.
"""
