"""The S3 endpoint the backup benchmark writes to: the throwaway Ceph cluster's RADOS Gateway
(tests/ceph/cluster.sh rgw, started by servers.CephCluster.start_rgw), and the rclone remote
whose `rclone copy` of a raw image into a bucket is the peer flashpath's backups are measured
against. What is here is pure (text in, text out) and tested by fpbench.tests_s3; running rclone
is the section's business.
"""

import os
from dataclasses import dataclass

# The region the requests are signed for: the gateway's default zonegroup accepts any, and S3
# clients want one.
RGW_REGION = "us-east-1"
# The rclone remote's name in the generated configuration.
RCLONE_REMOTE = "rgw"


@dataclass(frozen=True)
class S3Endpoint:
    url: str  # http://127.0.0.1:PORT, no trailing slash
    access_key: str
    secret_key: str
    region: str = RGW_REGION


def parse_rgw_start(stdout):
    """The endpoint from `cluster.sh rgw`'s output: its last three lines are the URL, the
    access key and the secret key."""
    lines = [line.strip() for line in stdout.strip().splitlines() if line.strip()]
    if len(lines) < 3:
        raise ValueError(f"cluster.sh rgw printed {len(lines)} lines, want the URL and two keys: {stdout!r}")
    url, access_key, secret_key = lines[-3:]
    if not url.startswith("http://127.0.0.1:") or not url.rsplit(":", 1)[1].isdigit():
        raise ValueError(f"cluster.sh rgw printed {url!r}, not http://127.0.0.1:PORT")
    if not access_key or not secret_key or any(c.isspace() for c in access_key + secret_key):
        raise ValueError("cluster.sh rgw printed an empty or spaced key")
    return S3Endpoint(url, access_key, secret_key)


def rclone_config(endpoint, remote=RCLONE_REMOTE):
    """rclone.conf text for an S3 remote on `endpoint` (rclone's provider Ceph: path-style
    bucket addressing, AWS signature v4). Keys are given, not taken from the environment, so a
    developer's AWS variables cannot redirect the benchmark."""
    for field in ("url", "access_key", "secret_key", "region"):
        value = getattr(endpoint, field)
        if not value or "\n" in value or "\r" in value:
            raise ValueError(f"S3 endpoint {field} {value!r} cannot go in an rclone config")
    if not remote.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"rclone remote name {remote!r}")
    return "\n".join([
        f"[{remote}]",
        "type = s3",
        "provider = Ceph",
        "env_auth = false",
        f"access_key_id = {endpoint.access_key}",
        f"secret_access_key = {endpoint.secret_key}",
        f"endpoint = {endpoint.url}",
        f"region = {endpoint.region}",
        # Not no_check_bucket: with it rclone mkdir creates nothing, and a copy into a missing
        # bucket fails (NoSuchBucket) only after rclone's retries.
        "",
    ])


def write_rclone_config(path, endpoint, remote=RCLONE_REMOTE):
    """Writes rclone_config() to `path`, readable by its owner only (it holds the secret key);
    returns `path`."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    # The mode above is for a new file only: an older one keeps its own.
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(rclone_config(endpoint, remote))
    return path


def rclone_env(environ):
    """The environment to run rclone in: `environ` without AWS_* and RCLONE_* variables. rclone
    reads RCLONE_* as options (RCLONE_CONFIG_RGW_ENDPOINT would move the remote), and its AWS
    SDK reads AWS_CA_BUNDLE whatever env_auth says: with one set, rclone 1.60 fails every
    request to a plain-HTTP endpoint ("LoadCustomCABundleError: ... unsupported transport")."""
    return {k: v for k, v in environ.items() if not k.startswith(("AWS_", "RCLONE_"))}


def rclone_copy_cmd(config_path, source, bucket, remote=RCLONE_REMOTE, extra=()):
    """`rclone copy` of the file `source` into `bucket` on the remote (the object keeps the
    file's name), with the generated configuration only; `extra` are further flags (the
    benchmark's transfers, chunk size and concurrency). Run it in rclone_env()."""
    return ["rclone", "--config", config_path, "copy", source, f"{remote}:{bucket}", *extra]
