# Multi-stage build of gpu-scheduler: a static binary on distroless, non-root.
# The builder runs on the build platform and cross-compiles; the final stage
# is the target platform's image (no --platform pin there).
FROM --platform=${BUILDPLATFORM} golang:1.26 AS build
ARG TARGETOS=linux
ARG TARGETARCH=amd64
ARG VERSION=dev
ARG GIT_COMMIT=unknown
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} go build -trimpath \
    -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=v1.37.2 -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37 -X github.com/gpu-scheduler/gpu-scheduler/pkg/version.Version=${VERSION} -X k8s.io/client-go/pkg/version.gitVersion=${VERSION} -X k8s.io/client-go/pkg/version.gitCommit=${GIT_COMMIT}" \
    -o /out/gpu-scheduler ./cmd/gpu-scheduler

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/gpu-scheduler /usr/local/bin/gpu-scheduler
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/gpu-scheduler"]
