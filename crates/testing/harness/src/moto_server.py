"""moto_server, hashing a request's body as it was sent when it checks a SigV4 signature.

moto rebuilds a form-encoded body from the fields werkzeug parsed (with `+` for a space) before it hashes
it, so a request signed over the body as sent (`%20`, as the AWS SDK for Rust and every SDK but botocore
encode a space) fails moto's check whenever a value holds a space.

moto's DescribeNetworkInterfaces also lacks EC2's `attachment.status` filter (it answers 500), which the AWS
provider sends for Fargate nodes as upstream does: an interface with an attachment is `attached`, any
other `detached`. Everything else is moto's own. Arguments: moto_server's.
"""

import io
import sys
import threading

from moto import server
from moto.ec2.models.elastic_network_interfaces import NetworkInterface
from moto.iam.access_control import IAMRequestBase
from moto.moto_server.werkzeug_app import DomainDispatcherApplication

_sent = threading.local()
_dispatch = DomainDispatcherApplication.__call__
_aws_request = IAMRequestBase._create_aws_request


def _keep_body(self, environ, start_response):
    length = int(environ.get("CONTENT_LENGTH") or 0)
    body = environ["wsgi.input"].read(length) if length > 0 else b""
    environ["wsgi.input"] = io.BytesIO(body)
    _sent.body = body
    return _dispatch(self, environ, start_response)


def _signed_body(self):
    request = _aws_request(self)
    body = getattr(_sent, "body", b"")
    if body:
        request.data = body
    return request


_interface_filter = NetworkInterface.get_filter_value


def _with_attachment_status(self, filter_name, method_name=None):
    if filter_name == "attachment.status":
        return "attached" if self.attachment_id else "detached"
    return _interface_filter(self, filter_name, method_name)


NetworkInterface.get_filter_value = _with_attachment_status
DomainDispatcherApplication.__call__ = _keep_body
IAMRequestBase._create_aws_request = _signed_body

if __name__ == "__main__":
    server.main(sys.argv[1:])
