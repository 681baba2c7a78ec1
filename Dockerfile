# One image for every console process: the web server, the control worker and host agents.
# GPU hosts build it with --build-arg TORCH_VARIANT=cu128 (CUDA torch and vllm instead of the
# CPU builds); everything else is the same.
FROM python:3.11-slim-bookworm

ARG TORCH_VARIANT=cpu
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    CONSOLE_VAR_DIR=/app/var \
    BOOTSTRAP_SYSTEM_PACKAGES=0 \
    PATH=/app/.venv/bin:$PATH

# bubblewrap: the sandboxes' default driver. No browser and no compose tool in the image.
RUN apt-get update -q \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      bubblewrap build-essential ca-certificates \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /app
# Dependencies first, so code edits do not reinstall them.
COPY pyproject.toml ./
COPY scripts/ scripts/
RUN mkdir -p console training rewards sandboxes \
 && TORCH_VARIANT=$TORCH_VARIANT scripts/bootstrap.sh
COPY . .
RUN .venv/bin/python -m pip install -q --no-deps -e . \
 && DEBUG=0 SECRET_KEY=collectstatic-only-not-a-runtime-secret ALLOWED_HOSTS=build \
    .venv/bin/python manage.py collectstatic --noinput

RUN useradd --create-home --uid 10001 console && mkdir -p /app/var && chown -R console /app/var
USER console
EXPOSE 8000
CMD ["uvicorn", "console.asgi:application", "--host", "0.0.0.0", "--port", "8000", \
     "--ws", "websockets-sansio", "--proxy-headers", "--forwarded-allow-ips", "*"]
