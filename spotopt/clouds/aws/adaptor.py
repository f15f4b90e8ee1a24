"""boto3 clients for the AWS collectors, from boto3's default credential chain.

SDK-side retries are switched off (``total_max_attempts=1``): the collectors' own bounded,
jittered retry decides, so a throttled call is not retried 5 × 5 times.
"""

from __future__ import annotations

from typing import Any

from spotopt.cloud_calls import MissingCredentials
from spotopt.clouds.common.http import HttpJson

CREDENTIALS_HINT = (
    "configure AWS credentials (aws configure, AWS_PROFILE, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY "
    "or an instance role)"
)
# The Price List Query API is served only from us-east-1, eu-central-1 and ap-south-1.
PRICING_REGION = "us-east-1"


class AwsClients:
    """EC2 clients per region, the Price List client and plain HTTP (Spot Advisor JSON).

    ``session`` (a ``boto3.Session``) is for tests; by default one is built from the default
    chain on first use and refused with ``MissingCredentials`` when the chain finds nothing.
    ``endpoint_url`` (``aws_endpoint_url``) sends every call to another endpoint (moto's server).
    """

    def __init__(
        self, session: Any | None = None, http: HttpJson | None = None, endpoint_url: str | None = None
    ) -> None:
        self._session = session
        self._endpoint_url = endpoint_url or None
        self._clients: dict[tuple[str, str], Any] = {}
        self.http = http or HttpJson()

    def _boto_session(self) -> Any:
        if self._session is None:
            import boto3

            self._session = boto3.Session()
        if self._session.get_credentials() is None:
            raise MissingCredentials("aws", CREDENTIALS_HINT)
        return self._session

    def client(self, service: str, region: str) -> Any:
        key = (service, region)
        if key not in self._clients:
            from botocore.config import Config

            config = Config(retries={"total_max_attempts": 1}, user_agent_extra="spotopt")
            self._clients[key] = self._boto_session().client(
                service, region_name=region, config=config, endpoint_url=self._endpoint_url
            )
        return self._clients[key]

    def ec2(self, region: str) -> Any:
        return self.client("ec2", region)

    def pricing(self) -> Any:
        return self.client("pricing", PRICING_REGION)

    def home_region(self) -> str:
        """The region to ask for the region list: the configured default, else us-east-1."""
        return self._boto_session().region_name or "us-east-1"
