"""How a cluster is run: the embedded local head, a joined node, a KubeRay RayCluster; profiles and status.

Each kind behind one small interface (``base.Cluster``: up, status, down); ``factory.make_cluster`` picks one.
Also the low-level clients both halves use: the Ray dashboard (``dashboard``) and Kubernetes (``k8s_*``).
"""
