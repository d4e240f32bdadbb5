# syntax=docker/dockerfile:1
# greendot: one static binary runs every process kind (gateway, reaper,
# fanout, standalone, and the operator's buckets and graph commands).
#
#   docker build -t greendot .
#   docker run --rm greendot gateway --help

FROM golang:1.26-alpine AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=0.1.0
# Static: no C library at run time, so it runs on any base image.
RUN CGO_ENABLED=0 go build -trimpath \
      -ldflags "-s -w -X github.com/greendot/greendot/pkg/version.stamp=${VERSION}" \
      -o /out/greendot ./cmd/greendot

FROM alpine:3.22
# busybox wget answers the health checks of compose.yaml.
RUN adduser -D -H -u 10001 greendot
COPY --from=build /out/greendot /usr/local/bin/greendot
USER 10001:10001
# 8080: a gateway's WebSockets and HTTP API; 9090: a reaper's or fanout's
# --metrics-listen (health and metrics).
EXPOSE 8080 9090
ENTRYPOINT ["greendot"]
CMD ["--help"]
