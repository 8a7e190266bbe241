"""Fixtures for tiering tests (see tierhelp.py): small-maxmemory Valkey, ext4 dir, moto S3."""

from tierhelp import moto_s3, nvme_dir, small_valkey

__all__ = ["moto_s3", "nvme_dir", "small_valkey"]  # fixtures: pytest finds them here
