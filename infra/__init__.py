"""Scripts and helpers to install and start what Offerbus needs (ZooKeeper, Docker)."""
