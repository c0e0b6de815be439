"""Replicas behind a router (`cluster.Cluster`, `router`), and prefill/decode
disaggregation (`disagg`). The replica class is given; the cluster imports no engine."""
