"""Download the daemon's artifacts on a fresh instance with its own identity, and check their sha256.

The start-up script runs this file's source with the image's ``python3`` before anything is
installed, so it uses the standard library only and imports nothing from spotopt. It holds no
credential: each cloud's instance identity is asked for a short-lived one, exactly as the SDKs'
default chains do on an instance.

- **AWS** (``s3://``): IMDSv2 (``PUT /latest/api/token``, then the role's temporary keys from
  ``iam/security-credentials/ROLE``), and a Signature Version 4 ``GET`` of the object (AWS
  General Reference, "Signature Version 4 signing process"; S3's canonical URI encodes each key
  segment once). A bucket in another region answers with ``x-amz-bucket-region``; the request is
  signed again for that region. A presigned URL made by the daemon would work too, but it is a
  bearer token in the user data, which anyone allowed ``ec2:DescribeInstanceAttribute`` reads.
- **GCP** (``gs://``): an access token from the metadata server
  (``instance/service-accounts/default/token``, header ``Metadata-Flavor: Google``), then the
  JSON API's ``GET /storage/v1/b/BUCKET/o/OBJECT?alt=media``.
- **Azure** (``az://``): a managed-identity token for ``https://storage.azure.com/`` from IMDS
  (``/metadata/identity/oauth2/token``, header ``Metadata: true``; ``msi_res_id`` picks the
  user-assigned identity), then ``GET https://ACCOUNT.blob.core.windows.net/CONTAINER/BLOB``
  with ``x-ms-version`` 2020-04-08 (bearer tokens need 2017-11-09 or later).
- ``file://``: a path on the instance's own disk.

Every artifact's sha256 is checked before it is moved into place; a mismatch exits non-zero
naming the artifact, so the script stops before pip runs. Endpoints can be overridden the way
the agent's own pollers are (``SPOTOPT_<CLOUD>_METADATA_URL``) and as the store's back-end is
(``endpoint_url`` / ``account_host`` in ``SPOTOPT_STORAGE_OPTIONS``), which is how the offline
tests reach moto and the fakes.

Usage: ``python3 fetch.py STORE_URL REGION IDENTITY (KEY SHA256 DEST)...``: ``KEY`` under
``STORE_URL``, ``IDENTITY`` the Azure managed identity's resource id or ``-``.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from email.message import Message
from typing import Any

Answer = tuple[int, Message | None, bytes]
Options = dict[str, Any]

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


def http(url: str, headers: dict[str, str] | None = None, method: str = "GET") -> Answer:
    """(status, headers, body) of one request; HTTP errors are answers too."""
    request = urllib.request.Request(url, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, answer.headers, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read()


def ok(answer: Answer, what: str) -> bytes:
    status, _, body = answer
    if status != 200:
        sys.exit(f"spotopt fetch: {what}: HTTP {status}: {body[:300].decode('utf-8', 'replace')}")
    return body


def aws_credentials() -> dict[str, str]:
    base = os.environ.get("SPOTOPT_AWS_METADATA_URL", "http://169.254.169.254").rstrip("/")
    token = ok(
        http(f"{base}/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": "300"}, "PUT"),
        "IMDSv2 token",
    ).decode()
    head = {"X-aws-ec2-metadata-token": token}
    where = f"{base}/latest/meta-data/iam/security-credentials/"
    role = ok(http(where, head), "instance role").decode().split()[0]
    return json.loads(ok(http(where + role, head), "instance role credentials"))


def sigv4_headers(url: str, region: str, creds: dict[str, str], now: datetime.datetime) -> dict[str, str]:
    """The headers of a SigV4-signed S3 ``GET url`` (empty payload)."""
    parts = urllib.parse.urlsplit(url)
    stamp, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    headers = {"host": parts.netloc, "x-amz-content-sha256": EMPTY_SHA256, "x-amz-date": stamp}
    if creds.get("Token"):
        headers["x-amz-security-token"] = creds["Token"]
    names = sorted(headers)
    query = "&".join(
        f"{urllib.parse.quote(k, safe='-_.~')}={urllib.parse.quote(v, safe='-_.~')}"
        for k, v in sorted(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
    )
    lines = (f"{n}:{headers[n].strip()}" for n in names)
    canonical = "\n".join(["GET", parts.path or "/", query, *lines, "", ";".join(names), EMPTY_SHA256])
    scope = f"{day}/{region}/s3/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = ("AWS4" + creds["SecretAccessKey"]).encode()
    for part in (day, region, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["Authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={creds['AccessKeyId']}/{scope}, "
        f"SignedHeaders={';'.join(names)}, Signature={signature}"
    )
    return headers


def s3_get(bucket: str, key: str, region: str, options: Options) -> bytes:
    creds = aws_credentials()
    endpoint = options.get("endpoint_url") or (options.get("client_kwargs") or {}).get("endpoint_url")
    path = urllib.parse.quote(key, safe="/-_.~")
    for _ in range(2):
        if endpoint:  # an S3-compatible endpoint (moto in the tests): path-style
            url = f"{endpoint.rstrip('/')}/{bucket}/{path}"
        else:
            url = f"https://{bucket}.s3.{region}.amazonaws.com/{path}"
        now = datetime.datetime.now(datetime.UTC)
        answer = http(url, sigv4_headers(url, region, creds, now))
        moved = answer[1].get("x-amz-bucket-region") if answer[1] is not None else None
        if answer[0] == 200 or not moved or moved == region:
            return ok(answer, f"s3://{bucket}/{key}")
        region = moved
    return ok(answer, f"s3://{bucket}/{key}")


def gcs_get(bucket: str, key: str, options: Options) -> bytes:
    base = os.environ.get("SPOTOPT_GCP_METADATA_URL", "http://metadata.google.internal").rstrip("/")
    token_url = f"{base}/computeMetadata/v1/instance/service-accounts/default/token"
    token = json.loads(ok(http(token_url, {"Metadata-Flavor": "Google"}), "service account token"))
    endpoint = (options.get("endpoint_url") or "https://storage.googleapis.com").rstrip("/")
    url = f"{endpoint}/storage/v1/b/{bucket}/o/{urllib.parse.quote(key, safe='')}?alt=media"
    return ok(http(url, {"Authorization": f"Bearer {token['access_token']}"}), f"gs://{bucket}/{key}")


def azure_get(container: str, key: str, identity: str, options: Options) -> bytes:
    base = os.environ.get("SPOTOPT_AZURE_METADATA_URL", "http://169.254.169.254").rstrip("/")
    query = {"api-version": "2018-02-01", "resource": "https://storage.azure.com/"}
    if identity != "-":
        query["msi_res_id"] = identity
    token_url = f"{base}/metadata/identity/oauth2/token?{urllib.parse.urlencode(query)}"
    token = json.loads(ok(http(token_url, {"Metadata": "true"}), "managed identity token"))
    account = options.get("account_name") or os.environ.get("AZURE_STORAGE_ACCOUNT_NAME")
    host = options.get("account_host") or f"{account}.blob.core.windows.net"
    scheme = "http" if host.startswith(("127.0.0.1", "localhost")) else "https"
    url = f"{scheme}://{host}/{container}/{urllib.parse.quote(key, safe='/-_.~')}"
    head = {"Authorization": f"Bearer {token['access_token']}", "x-ms-version": "2020-04-08"}
    return ok(http(url, head), f"az://{container}/{key}")


def get(store_url: str, key: str, region: str, identity: str, options: Options) -> bytes:
    """The bytes of ``key`` under ``store_url``."""
    scheme, _, rest = store_url.partition("://")
    if not rest:  # a plain path
        scheme, rest = "file", store_url
    bucket, _, prefix = rest.partition("/")
    full = "/".join(p for p in (prefix.strip("/"), key) if p)
    if scheme == "file":
        with open(os.path.join(rest, key), "rb") as f:
            return f.read()
    if scheme == "s3":
        return s3_get(bucket, full, region, options)
    if scheme in ("gs", "gcs"):
        return gcs_get(bucket, full, options)
    if scheme in ("az", "abfs"):
        return azure_get(bucket, full, identity, options)
    sys.exit(f"spotopt fetch: {store_url}: scheme {scheme!r} is not supported")


def main(argv: list[str]) -> None:
    store_url, region, identity, rest = argv[0], argv[1], argv[2], argv[3:]
    options = json.loads(os.environ.get("SPOTOPT_STORAGE_OPTIONS") or "{}")
    for key, sha, dest in zip(rest[0::3], rest[1::3], rest[2::3], strict=True):
        data = get(store_url, key, region, identity, options)
        got = hashlib.sha256(data).hexdigest()
        if got != sha:
            sys.exit(f"spotopt fetch: {key}: sha256 {got} is not the daemon's {sha}; refusing to install it")
        with open(dest + ".part", "wb") as f:
            f.write(data)
        os.replace(dest + ".part", dest)
        print(f"spotopt fetch: {key}: sha256 verified")


if __name__ == "__main__":
    main(sys.argv[1:])
