{{/*
Named templates. Every one takes the carapace chart's scope: `.` inside this chart, and
`.Subcharts.carapace` in a parent chart that has carapace as a dependency, for example

  containers:
    - name: my-app
      ...
    - {{ include "carapace.container" .Subcharts.carapace | nindent 6 | trim }}
  volumes:
    {{- include "carapace.volumes" .Subcharts.carapace | nindent 4 }}

Paths inside the carapace container (fixed: the rendered configuration points at them).
*/}}
{{- define "carapace.path.config" -}}/etc/carapace/carapace.yaml{{- end }}
{{- define "carapace.path.identity" -}}/etc/carapace/identity{{- end }}
{{- define "carapace.path.frontKeys" -}}/etc/carapace/keys{{- end }}
{{- define "carapace.path.upstream" -}}/etc/carapace/upstream{{- end }}
{{- define "carapace.path.redis" -}}/etc/carapace/redis{{- end }}
{{- define "carapace.path.pairingTls" -}}/etc/carapace/pairing-tls{{- end }}
{{- define "carapace.path.mcpSession" -}}/etc/carapace/mcp-session{{- end }}
{{- define "carapace.path.eatKeys" -}}/etc/carapace/eat-keys{{- end }}
{{/* The state volume's mount, and state_dir inside it: a fresh emptyDir or claim belongs to
root with a mode others may enter, which carapace refuses for the directory of its keys; a
directory it creates itself there is its own, mode 0700. */}}
{{- define "carapace.path.stateVolume" -}}/var/lib/carapace{{- end }}
{{- define "carapace.path.state" -}}/var/lib/carapace/state{{- end }}
{{- define "carapace.path.run" -}}/run/carapace{{- end }}

{{/* The name part of object names. */}}
{{- define "carapace.name" -}}
{{- default "carapace" .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* "<release>-carapace", or fullnameOverride; at most 63 characters. */}}
{{- define "carapace.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := include "carapace.name" . }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Name of the pairing Service (a suffix on the fullname, kept within 63 characters). */}}
{{- define "carapace.pairingServiceName" -}}
{{- printf "%s-pairing" (include "carapace.fullname" . | trunc 55 | trimSuffix "-") }}
{{- end }}

{{/* Name of the ConfigMap holding carapace.yaml. */}}
{{- define "carapace.configMapName" -}}
{{- include "carapace.fullname" . }}
{{- end }}

{{/* The identity Secret: identity.existingSecret, or "<fullname>-identity". */}}
{{- define "carapace.identitySecretName" -}}
{{- default (printf "%s-identity" (include "carapace.fullname" .)) .Values.identity.existingSecret }}
{{- end }}

{{- define "carapace.imageTag" -}}
{{- default .Chart.AppVersion .Values.image.tag }}
{{- end }}

{{- define "carapace.image" -}}
{{- printf "%s:%s" .Values.image.repository (include "carapace.imageTag" .) }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "carapace.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "carapace.selectorLabels" . }}
app.kubernetes.io/version: {{ include "carapace.imageTag" . | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Selector of the chart's own Deployment. */}}
{{- define "carapace.selectorLabels" -}}
app.kubernetes.io/name: {{ include "carapace.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
The label the Services and the NetworkPolicy select: every pod that runs this carapace
carries it, the chart's own or a parent chart's.
*/}}
{{- define "carapace.podLabels" -}}
carapace/sidecar: {{ include "carapace.fullname" . }}
{{- end }}

{{/* Pod annotations: a config change changes the checksum, so the pods roll. */}}
{{- define "carapace.podAnnotations" -}}
checksum/config: {{ include "carapace.config" . | sha256sum }}
{{- end }}

{{/* Pod-level securityContext: fsGroup makes the mounted Secrets (mode 0440) readable. */}}
{{- define "carapace.podSecurityContext" -}}
{{ toYaml .Values.podSecurityContext }}
{{- end }}

{{/*
Checks that span several values (the rest is in values.schema.json). Renders nothing; fails
the render with a message naming the value.
*/}}
{{- define "carapace.validate" -}}
{{- $v := .Values }}
{{- if eq $v.role "gateway" }}
{{- if $v.pairing.enabled }}
{{- fail "pairing.enabled: the pairing endpoint is the tool-host side; a gateway pairs tool hosts with `carapace pair` on its admin socket" }}
{{- end }}
{{- if and $v.deployment.enabled (gt (int $v.replicaCount) 1) }}
{{- fail "replicaCount: the gateway role keeps its CA and peer store in state_dir, so it runs one replica" }}
{{- end }}
{{- if not $v.gateway.id }}
{{- fail "gateway.id is required with role: gateway" }}
{{- end }}
{{- end }}
{{- if and (eq $v.sharedState.backend "memory") $v.deployment.enabled (gt (int $v.replicaCount) 1) (or (eq $v.front.protocol "skill-v1") (eq $v.front.auth.mode "http_signature")) }}
{{- fail "sharedState.backend: with several replicas a signed front (skill-v1, or http_signature) needs redis, or a nonce used on one replica is accepted again on another" }}
{{- end }}
{{- if and $v.deployment.enabled (gt (int $v.replicaCount) 1) (eq $v.front.protocol "mcp") (not $v.front.mcp.sessionKey.existingSecret) }}
{{- fail "front.mcp.sessionKey.existingSecret: with several replicas an mcp front needs one session key for all, or a session opened on one replica is unknown to the others" }}
{{- end }}
{{- if and $v.deployment.enabled (gt (int $v.replicaCount) 1) $v.front.eat (not $v.front.eatKeys.existingSecret) }}
{{- fail "front.eatKeys.existingSecret: with several replicas an EAT catalog needs one set of signing keys for all, or a signature made on one replica names a key another replica's did.json does not publish" }}
{{- end }}
{{- end }}

{{/*
The carapace configuration (carapace.yaml), built as a map and printed with toYaml so every
value is quoted correctly. The JSON Schema of the file is `carapace config-schema`.
*/}}
{{- define "carapace.config" -}}
{{- $v := .Values }}
{{- $cfg := dict "state_dir" (include "carapace.path.state" .) }}
{{- /* front */}}
{{- $front := dict "protocol" $v.front.protocol }}
{{- $signed := or (eq $v.front.protocol "skill-v1") (eq $v.front.auth.mode "http_signature") }}
{{- if $signed }}
{{- if eq $v.front.protocol "skill-v1" }}
{{- with $v.front.skillId }}{{ $_ := set $front "skill_id" . }}{{ end }}
{{- end }}
{{- $a := $v.front.auth }}
{{- $keys := list }}
{{- range $a.keys }}
{{- $keys = append $keys (dict "id" . "secret" (dict "file" (printf "%s/%s" (include "carapace.path.frontKeys" $) .))) }}
{{- end }}
{{- $auth := dict "mode" $a.mode "keys" $keys }}
{{- with $a.headerName }}{{ $_ := set $auth "header_name" . }}{{ end }}
{{- if not (kindIs "invalid" $a.timestampSkewS) }}{{ $_ := set $auth "timestamp_skew_s" $a.timestampSkewS }}{{ end }}
{{- if not (kindIs "invalid" $a.nonceTtlS) }}{{ $_ := set $auth "nonce_ttl_s" $a.nonceTtlS }}{{ end }}
{{- if not (kindIs "invalid" $a.nonceCapacity) }}{{ $_ := set $auth "nonce_capacity" $a.nonceCapacity }}{{ end }}
{{- $_ := set $front "auth" $auth }}
{{- end }}
{{- if eq $v.front.protocol "mcp" }}
{{- $m := $v.front.mcp }}
{{- $mcp := dict "path" $m.path "allowed_origins" $m.allowedOrigins }}
{{- if not (kindIs "invalid" $m.listTtlMs) }}{{ $_ := set $mcp "list_ttl_ms" $m.listTtlMs }}{{ end }}
{{- if not (kindIs "invalid" $m.pageSize) }}{{ $_ := set $mcp "page_size" $m.pageSize }}{{ end }}
{{- if not (kindIs "invalid" $m.sessionIdleTimeoutS) }}{{ $_ := set $mcp "session_idle_timeout_s" $m.sessionIdleTimeoutS }}{{ end }}
{{- if not (kindIs "invalid" $m.sessionMaxLifetimeS) }}{{ $_ := set $mcp "session_max_lifetime_s" $m.sessionMaxLifetimeS }}{{ end }}
{{- if $m.sessionKey.existingSecret }}
{{- $_ := set $mcp "session_key" (dict "file" (printf "%s/%s" (include "carapace.path.mcpSession" .) $m.sessionKey.key)) }}
{{- end }}
{{- $_ := set $front "mcp" $mcp }}
{{- with $v.front.oauth }}{{ $_ := set $front "oauth" . }}{{ end }}
{{- end }}
{{- with $v.front.eat }}
{{- $eat := deepCopy . }}
{{- if $v.front.eatKeys.existingSecret }}
{{- $_ := set $eat "keys_file" (printf "%s/%s" (include "carapace.path.eatKeys" $) $v.front.eatKeys.key) }}
{{- end }}
{{- $_ := set $front "eat" $eat }}
{{- end }}
{{- $_ := set $cfg "front" $front }}
{{- /* listeners */}}
{{- if eq $v.role "gateway" }}
{{- $_ := set $cfg "listeners" (dict "unix" (dict "path" (printf "%s/tools.sock" (include "carapace.path.run" .)) "mode" "0660")) }}
{{- else }}
{{- $id := include "carapace.path.identity" . }}
{{- $tls := dict "cert_file" (printf "%s/tls.crt" $id) "key_file" (printf "%s/tls.key" $id) }}
{{- if or (eq $v.front.protocol "tools-v1") (eq $v.front.protocol "mcp") }}
{{- $_ := set $tls "client_ca_file" (printf "%s/ca.crt" $id) }}
{{- end }}
{{- $_ := set $cfg "listeners" (dict "tcp" (dict "address" (printf "0.0.0.0:%d" (int $v.listener.port)) "tls" $tls)) }}
{{- if $v.identity.peersInSecret }}
{{- $_ := set $cfg "peers" (dict "file" (printf "%s/peers.json" $id)) }}
{{- end }}
{{- end }}
{{- /* app */}}
{{- $u := $v.upstream }}
{{- $app := dict "protocol" $u.protocol "address" $u.address }}
{{- with $u.discovery }}{{ $_ := set $app "discovery" . }}{{ end }}
{{- with $u.pool }}{{ $_ := set $app "pool" . }}{{ end }}
{{- if eq $u.protocol "mcp" }}{{ $_ := set $app "mcp" (dict "path" $u.mcpPath) }}{{ end }}
{{- with $u.filter }}{{ $_ := set $app "filter" . }}{{ end }}
{{- with $u.pinning }}{{ $_ := set $app "pinning" . }}{{ end }}
{{- if eq $u.protocol "skill-v1" }}
{{- $s := $u.skill }}
{{- $skill := dict "skill_id" $s.skillId "protocol_version" $s.protocolVersion "capabilities" $s.capabilities }}
{{- if not (kindIs "invalid" $s.timeoutMsDefault) }}{{ $_ := set $skill "timeout_ms_default" $s.timeoutMsDefault }}{{ end }}
{{- if not (kindIs "invalid" $s.timeoutMsMax) }}{{ $_ := set $skill "timeout_ms_max" $s.timeoutMsMax }}{{ end }}
{{- if $s.auth.mode }}
{{- $sa := dict "mode" $s.auth.mode "secret" (dict "file" (printf "%s/%s" (include "carapace.path.upstream" .) $s.auth.secretKey)) }}
{{- with $s.auth.headerName }}{{ $_ := set $sa "header_name" . }}{{ end }}
{{- $_ := set $skill "auth" $sa }}
{{- end }}
{{- $_ := set $app "skill" $skill }}
{{- end }}
{{- $_ := set $cfg "app" $app }}
{{- /* enforcement, passed through as written in values */}}
{{- with $v.rateLimits }}{{ $_ := set $cfg "rate_limits" . }}{{ end }}
{{- with $v.limits }}{{ $_ := set $cfg "limits" . }}{{ end }}
{{- with $v.tools }}{{ $_ := set $cfg "tools" . }}{{ end }}
{{- with $v.killSwitch }}{{ $_ := set $cfg "kill_switch" . }}{{ end }}
{{- with $v.secretGuard }}{{ $_ := set $cfg "secret_guard" . }}{{ end }}
{{- if $v.callerTools.enabled }}{{ $_ := set $cfg "caller_tools" (omit $v.callerTools "enabled") }}{{ end }}
{{- /* provable invocations, passed through as written in values */}}
{{- with $v.receipts }}{{ $_ := set $cfg "receipts" . }}{{ end }}
{{- if $v.ledger.enabled }}{{ $_ := set $cfg "ledger" (omit $v.ledger "enabled") }}{{ end }}
{{- with $v.idempotency }}{{ $_ := set $cfg "idempotency" . }}{{ end }}
{{- with $v.metering }}{{ $_ := set $cfg "metering" . }}{{ end }}
{{- /* operations */}}
{{- $_ := set $cfg "ops" (dict "address" (printf "0.0.0.0:%d" (int $v.ops.port))) }}
{{- $_ := set $cfg "log" (dict "format" $v.log.format "level" $v.log.level) }}
{{- if not (kindIs "invalid" $v.runtime.workerThreads) }}
{{- $_ := set $cfg "runtime" (dict "worker_threads" $v.runtime.workerThreads) }}
{{- end }}
{{- /* pairing (tool host) */}}
{{- if and $v.pairing.enabled (ne $v.role "gateway") }}
{{- $p := $v.pairing }}
{{- $ptls := dict "cert_file" (printf "%s/tls.crt" (include "carapace.path.identity" .)) "key_file" (printf "%s/tls.key" (include "carapace.path.identity" .)) }}
{{- if $p.tls.existingSecret }}
{{- $ptls = dict "cert_file" (printf "%s/tls.crt" (include "carapace.path.pairingTls" .)) "key_file" (printf "%s/tls.key" (include "carapace.path.pairingTls" .)) }}
{{- end }}
{{- $pairing := dict "listen" (printf "0.0.0.0:%d" (int $p.port)) "component_id" $p.componentId "gateway_public_key_ed25519" $p.gatewayPublicKeyEd25519 "tls" $ptls }}
{{- with $p.path }}{{ $_ := set $pairing "path" . }}{{ end }}
{{- $_ := set $cfg "pairing" $pairing }}
{{- end }}
{{- /* gateway role */}}
{{- if eq $v.role "gateway" }}
{{- $_ := set $cfg "gateway" (dict "id" $v.gateway.id) }}
{{- $peers := dict }}
{{- range $id, $peer := $v.gateway.peers }}
{{- $p := dict "url" $peer.url }}
{{- if $peer.httpSignature }}{{ $_ := set $p "http_signature" true }}{{ end }}
{{- with $peer.receipts }}{{ $_ := set $p "receipts" . }}{{ end }}
{{- $_ := set $peers $id $p }}
{{- end }}
{{- $out := dict "socket" (printf "%s/outbound.sock" (include "carapace.path.run" .)) "peers" $peers }}
{{- if not (kindIs "invalid" $v.gateway.discoveryIntervalS) }}{{ $_ := set $out "discovery_interval_s" $v.gateway.discoveryIntervalS }}{{ end }}
{{- with $v.gateway.health }}{{ $_ := set $out "health" . }}{{ end }}
{{- $_ := set $cfg "outbound" $out }}
{{- end }}
{{- /* shared state */}}
{{- $ss := $v.sharedState }}
{{- $shared := dict "backend" $ss.backend }}
{{- if eq $ss.backend "redis" }}
{{- $prefix := $ss.redis.keyPrefix | default (printf "%s:" (include "carapace.fullname" .)) }}
{{- $r := dict "url" $ss.redis.url "key_prefix" $prefix "timeout_ms" $ss.redis.timeoutMs }}
{{- with $ss.redis.username }}{{ $_ := set $r "username" . }}{{ end }}
{{- if $ss.redis.password.existingSecret }}
{{- $_ := set $r "password" (dict "file" (printf "%s/%s" (include "carapace.path.redis" .) $ss.redis.password.key)) }}
{{- end }}
{{- $_ := set $shared "redis" $r }}
{{- end }}
{{- $_ := set $cfg "shared_state" $shared }}
{{- toYaml $cfg }}
{{- end }}

{{/* The ConfigMap holding carapace.yaml (rendered by templates/configmap.yaml). */}}
{{- define "carapace.configmap" -}}
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ include "carapace.configMapName" . }}
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "carapace.labels" . | nindent 4 }}
data:
  carapace.yaml: |
    {{- include "carapace.config" . | nindent 4 }}
{{- end }}

{{/* A probe: the httpGet on the ops port, then the timings from values. */}}
{{- define "carapace.probe" -}}
httpGet:
  path: {{ .path }}
  port: ops
  scheme: HTTP
{{- with .timings }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
The carapace container (a map: put it after "- " in a containers list, with
`nindent N | trim` where N is the column of the "- " plus 2). Its ports: tools
(tool-host role), pairing (when enabled) and ops; its probes: /healthz and /readyz on ops.
*/}}
{{- define "carapace.container" -}}
{{- include "carapace.validate" . }}
{{- $v := .Values -}}
name: carapace
image: {{ include "carapace.image" . | quote }}
imagePullPolicy: {{ $v.image.pullPolicy }}
args:
  - serve
  - --config
  - {{ include "carapace.path.config" . }}
env:
  # Where `carapace pair`, `kill-switch` and `peers` run in the container find the admin socket.
  - name: CARAPACE_ADMIN_SOCKET
    value: {{ include "carapace.path.state" . }}/admin.sock
  {{- with $v.env }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
ports:
  {{- if ne $v.role "gateway" }}
  - name: tools
    containerPort: {{ int $v.listener.port }}
    protocol: TCP
  {{- end }}
  {{- if and $v.pairing.enabled (ne $v.role "gateway") }}
  - name: pairing
    containerPort: {{ int $v.pairing.port }}
    protocol: TCP
  {{- end }}
  - name: ops
    containerPort: {{ int $v.ops.port }}
    protocol: TCP
livenessProbe:
  {{- include "carapace.probe" (dict "path" "/healthz" "timings" $v.probes.liveness) | nindent 2 }}
readinessProbe:
  {{- include "carapace.probe" (dict "path" "/readyz" "timings" $v.probes.readiness) | nindent 2 }}
{{- with $v.resources }}
resources:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  readOnlyRootFilesystem: true
  allowPrivilegeEscalation: false
  privileged: false
  capabilities:
    drop:
      - ALL
  seccompProfile:
    type: RuntimeDefault
volumeMounts:
  - name: carapace-config
    mountPath: {{ include "carapace.path.config" . }}
    subPath: carapace.yaml
    readOnly: true
  - name: carapace-state
    mountPath: {{ include "carapace.path.stateVolume" . }}
  {{- if eq $v.role "gateway" }}
  - name: carapace-run
    mountPath: {{ include "carapace.path.run" . }}
  {{- else }}
  - name: carapace-identity
    mountPath: {{ include "carapace.path.identity" . }}
    readOnly: true
  {{- end }}
  {{- if and (or (eq $v.front.protocol "skill-v1") (eq $v.front.auth.mode "http_signature")) $v.front.auth.keys }}
  - name: carapace-front-keys
    mountPath: {{ include "carapace.path.frontKeys" . }}
    readOnly: true
  {{- end }}
  {{- if and (eq $v.front.protocol "mcp") $v.front.mcp.sessionKey.existingSecret }}
  - name: carapace-mcp-session-key
    mountPath: {{ include "carapace.path.mcpSession" . }}
    readOnly: true
  {{- end }}
  {{- if and $v.front.eat $v.front.eatKeys.existingSecret }}
  - name: carapace-eat-keys
    mountPath: {{ include "carapace.path.eatKeys" . }}
    readOnly: true
  {{- end }}
  {{- if and (eq $v.upstream.protocol "skill-v1") $v.upstream.skill.auth.mode }}
  - name: carapace-upstream-secret
    mountPath: {{ include "carapace.path.upstream" . }}
    readOnly: true
  {{- end }}
  {{- if and (eq $v.sharedState.backend "redis") $v.sharedState.redis.password.existingSecret }}
  - name: carapace-redis-password
    mountPath: {{ include "carapace.path.redis" . }}
    readOnly: true
  {{- end }}
  {{- if and $v.pairing.enabled (ne $v.role "gateway") $v.pairing.tls.existingSecret }}
  - name: carapace-pairing-tls
    mountPath: {{ include "carapace.path.pairingTls" . }}
    readOnly: true
  {{- end }}
{{- end }}

{{/*
The pod volumes the carapace container mounts (list items: put them under "volumes:").
Secrets are mounted with mode 0440: the pod needs fsGroup 65532 (carapace.podSecurityContext).
*/}}
{{- define "carapace.volumes" -}}
{{- $v := .Values -}}
- name: carapace-config
  configMap:
    name: {{ include "carapace.configMapName" . }}
- name: carapace-state
  {{- if and (eq $v.role "gateway") $v.state.existingClaim }}
  persistentVolumeClaim:
    claimName: {{ $v.state.existingClaim }}
  {{- else }}
  emptyDir:
    {{- with $v.state.sizeLimit }}
    sizeLimit: {{ . }}
    {{- end }}
  {{- end }}
{{- if eq $v.role "gateway" }}
- name: carapace-run
  emptyDir:
    medium: Memory
    sizeLimit: 1Mi
{{- else }}
- name: carapace-identity
  secret:
    secretName: {{ include "carapace.identitySecretName" . }}
    defaultMode: 288  # 0440: owner and group (fsGroup) read
{{- end }}
{{- if and (or (eq $v.front.protocol "skill-v1") (eq $v.front.auth.mode "http_signature")) $v.front.auth.keys }}
- name: carapace-front-keys
  secret:
    secretName: {{ required "front.auth.existingSecret is required for front.auth.keys" $v.front.auth.existingSecret }}
    defaultMode: 288  # 0440: owner and group (fsGroup) read
    items:
      {{- range $v.front.auth.keys }}
      - key: {{ . | quote }}
        path: {{ . | quote }}
      {{- end }}
{{- end }}
{{- if and (eq $v.front.protocol "mcp") $v.front.mcp.sessionKey.existingSecret }}
- name: carapace-mcp-session-key
  secret:
    secretName: {{ $v.front.mcp.sessionKey.existingSecret }}
    defaultMode: 288  # 0440: owner and group (fsGroup) read
    items:
      - key: {{ $v.front.mcp.sessionKey.key | quote }}
        path: {{ $v.front.mcp.sessionKey.key | quote }}
{{- end }}
{{- if and $v.front.eat $v.front.eatKeys.existingSecret }}
- name: carapace-eat-keys
  secret:
    secretName: {{ $v.front.eatKeys.existingSecret }}
    defaultMode: 288  # 0440: owner and group (fsGroup) read
    items:
      - key: {{ $v.front.eatKeys.key | quote }}
        path: {{ $v.front.eatKeys.key | quote }}
{{- end }}
{{- if and (eq $v.upstream.protocol "skill-v1") $v.upstream.skill.auth.mode }}
- name: carapace-upstream-secret
  secret:
    secretName: {{ required "upstream.skill.auth.existingSecret is required with upstream.skill.auth.mode" $v.upstream.skill.auth.existingSecret }}
    defaultMode: 288  # 0440: owner and group (fsGroup) read
    items:
      - key: {{ $v.upstream.skill.auth.secretKey | quote }}
        path: {{ $v.upstream.skill.auth.secretKey | quote }}
{{- end }}
{{- if and (eq $v.sharedState.backend "redis") $v.sharedState.redis.password.existingSecret }}
- name: carapace-redis-password
  secret:
    secretName: {{ $v.sharedState.redis.password.existingSecret }}
    defaultMode: 288  # 0440: owner and group (fsGroup) read
    items:
      - key: {{ $v.sharedState.redis.password.key | quote }}
        path: {{ $v.sharedState.redis.password.key | quote }}
{{- end }}
{{- if and $v.pairing.enabled (ne $v.role "gateway") $v.pairing.tls.existingSecret }}
- name: carapace-pairing-tls
  secret:
    secretName: {{ $v.pairing.tls.existingSecret }}
    defaultMode: 288  # 0440: owner and group (fsGroup) read
    items:
      - key: tls.crt
        path: tls.crt
      - key: tls.key
        path: tls.key
{{- end }}
{{- end }}
