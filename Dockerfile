# Cadence with the echo model (CPU). Serving Moshi needs torch as well (`pip install .[model]`
# or scripts/setup --model, README "Serving Moshi"); a CUDA base image for GPUs is not provided.
FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends libopus0 \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/cadence
COPY pyproject.toml README.md ./
COPY cadence cadence
COPY engine engine
COPY gateway gateway
COPY kernels kernels
COPY web web
RUN pip install --no-cache-dir .
EXPOSE 8080 9101
# WebRTC media uses UDP on ephemeral ports: run with --network host, or give the gateway an
# --ice-address the browser can reach.
ENTRYPOINT ["cadence", "serve", "--host", "0.0.0.0", "--metrics-host", "0.0.0.0", \
            "--web-root", "/opt/cadence/web"]
