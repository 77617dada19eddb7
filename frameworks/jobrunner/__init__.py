"""The job runner: keeps every submitted job's service framework running inside the cluster."""
