"""A remote bootstrap hook in Python: every datacenter labelled logs=on gets a
log shipper. Any language with gRPC works the same way: implement
ctrlplane.bootstrap.v1.BootstrapHookService from proto/ and register the
endpoint with BootstrapService.RegisterHook.

    python -m grpc_tools.protoc -I proto --python_out=GEN --grpc_python_out=GEN \
        $(find proto -name '*.proto')
    PYTHONPATH=GEN python deploy/examples/hooks/remote_hook.py --port 9000
"""

import argparse
from concurrent import futures

import grpc

from ctrlplane.bootstrap.v1 import hook_pb2, hook_pb2_grpc, spec_pb2
from ctrlplane.provider.v1 import types_pb2


class LogShipperHook(hook_pb2_grpc.BootstrapHookServiceServicer):
    def GetHookInfo(self, request, context):
        return hook_pb2.GetHookInfoResponse(
            name="log-shipper", version="1", description="log shipper where logs=on"
        )

    def ContributeServices(self, request, context):
        dc = request.datacenter
        if dc.labels.get("logs") != "on":
            return hook_pb2.ContributeServicesResponse()
        shipper = spec_pb2.BootstrapServiceSpec(
            name="log-shipper",
            services=[
                types_pb2.ServiceSpec(
                    name="main",
                    command=["sh", "-c", "while true; do echo shipping logs of $DC; sleep 5; done"],
                    # Rendered by the bootstrap service for each datacenter.
                    env={"DC": "${datacenter.slug}"},
                )
            ],
        )
        return hook_pb2.ContributeServicesResponse(services=[shipper])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=9000)
    args = parser.parse_args()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    hook_pb2_grpc.add_BootstrapHookServiceServicer_to_server(LogShipperHook(), server)
    server.add_insecure_port(f"127.0.0.1:{args.port}")
    server.start()
    print(f"log-shipper hook listening on 127.0.0.1:{args.port}", flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
