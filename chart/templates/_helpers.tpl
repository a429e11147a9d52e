{{/*
Names. Kubernetes names are at most 63 characters.
*/}}
{{- define "switchboard.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "switchboard.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "switchboard.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "switchboard.selectorLabels" -}}
app.kubernetes.io/name: {{ include "switchboard.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "switchboard.labels" -}}
helm.sh/chart: {{ include "switchboard.chart" . }}
{{ include "switchboard.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: switchboard
{{- end }}

{{/*
Labels of the `helm test` pod. Deliberately not the selector labels: the
Service, the PDB, the spread constraints and the NetworkPolicy must never count
the test pod as a replica.
*/}}
{{- define "switchboard.testSelectorLabels" -}}
app.kubernetes.io/name: {{ include "switchboard.name" . }}-test
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "switchboard.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "switchboard.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "switchboard.secretName" -}}
{{- default (include "switchboard.fullname" .) .Values.secrets.existingSecret }}
{{- end }}

{{- define "switchboard.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
A value rendered as a template, bitnami's common.tplvalues.render: a string is
passed through `tpl`, anything else is turned into YAML first and then passed
through `tpl`, so values may say "{{ include \"switchboard.fullname\" . }}" or
"{{ .Release.Name }}". Usage:
  {{ include "switchboard.tplvalues" (dict "value" .Values.x "context" $) }}
*/}}
{{- define "switchboard.tplvalues" -}}
{{- if kindIs "string" .value }}
{{- tpl .value .context }}
{{- else }}
{{- tpl (.value | toYaml) .context }}
{{- end }}
{{- end }}

{{/*
Labels of the replica pods: podLabels (templated) under the chart's labels. The
selector labels always win, so a podLabels entry can never detach the pods from
their Deployment, Service, PDB or NetworkPolicy.
*/}}
{{- define "switchboard.podLabels" -}}
{{- $extra := dict }}
{{- with .Values.podLabels }}
{{- $extra = include "switchboard.tplvalues" (dict "value" . "context" $) | fromYaml }}
{{- end }}
{{- $labels := merge (include "switchboard.selectorLabels" . | fromYaml) $extra (include "switchboard.labels" . | fromYaml) }}
{{- toYaml $labels }}
{{- end }}

{{/*
PostgreSQL TLS (database.tls): libpq reads PGSSLMODE and PGSSLROOTCERT from the
environment for every connection that does not say otherwise in its URL, so
psycopg (the server) and psycopg2 (pgmigrate) both verify the server against
the mounted CA. Used by the Deployment and the migration Job.
*/}}
{{- define "switchboard.tlsEnv" -}}
{{- with .Values.database.tls }}
{{- if .enabled }}
- name: PGSSLMODE
  value: {{ .sslMode | quote }}
- name: PGSSLROOTCERT
  value: {{ printf "%s/%s" (.mountPath | trimSuffix "/") .caKey | quote }}
{{- end }}
{{- end }}
{{- end }}

{{- define "switchboard.tlsVolumeMount" -}}
{{- if .Values.database.tls.enabled }}
- name: postgresql-ca
  mountPath: {{ .Values.database.tls.mountPath }}
  readOnly: true
{{- end }}
{{- end }}

{{- define "switchboard.tlsVolume" -}}
{{- with .Values.database.tls }}
{{- if .enabled }}
- name: postgresql-ca
  {{- if .caSecret }}
  secret:
    secretName: {{ .caSecret }}
    items:
      - key: {{ .caKey }}
        path: {{ .caKey }}
    defaultMode: 0444
  {{- else }}
  configMap:
    name: {{ .caConfigMap }}
    items:
      - key: {{ .caKey }}
        path: {{ .caKey }}
    defaultMode: 0444
  {{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The replica count the release can drop to: replicaCount, or the HPA's floor.
*/}}
{{- define "switchboard.minReplicas" -}}
{{- if .Values.autoscaling.enabled }}
{{- .Values.autoscaling.minReplicas | int }}
{{- else }}
{{- .Values.replicaCount | int }}
{{- end }}
{{- end }}

{{- define "switchboard.maxReplicas" -}}
{{- if .Values.autoscaling.enabled }}
{{- .Values.autoscaling.maxReplicas | int }}
{{- else }}
{{- .Values.replicaCount | int }}
{{- end }}
{{- end }}

{{/*
A PodDisruptionBudget only when more than one replica is always running: with a
single replica any budget that protects it would block every node drain.
Returns "true" or "".
*/}}
{{- define "switchboard.pdbEnabled" -}}
{{- if and .Values.pdb.enabled (gt (include "switchboard.minReplicas" . | int) 1) }}true{{ end }}
{{- end }}

{{/*
PostgreSQL connections one replica process can hold: the pool, the relay's
LISTEN and read connections, the streams' LISTEN and read connections and, at
start-up, one short-lived migration connection.
*/}}
{{- define "switchboard.connectionsPerProcess" -}}
{{- add (.Values.config.poolSize | int) 5 }}
{{- end }}

{{/*
Relations the JSON schema cannot express. Included once, from the Deployment,
so `helm template` / `helm install` stop before anything is applied.
*/}}
{{- define "switchboard.validate" -}}
{{- $grace := .Values.terminationGracePeriodSeconds | int }}
{{- $sleep := .Values.preStop.sleepSeconds | int }}
{{- $drain := .Values.config.shutdownGraceSeconds | int }}
{{- if le $grace (add $sleep $drain) }}
{{- fail (printf "terminationGracePeriodSeconds (%d) must be larger than preStop.sleepSeconds (%d) + config.shutdownGraceSeconds (%d): the kubelet would SIGKILL the pod before it hands its work back" $grace $sleep $drain) }}
{{- end }}
{{- $s := .Values.secrets }}
{{- if $s.existingSecret }}
{{- if or $s.databaseUrl $s.jwtSecret $s.migrationDatabaseUrl $s.listenDatabaseUrl $s.readDatabaseUrl }}
{{- fail "secrets.existingSecret is set: leave secrets.databaseUrl, jwtSecret, migrationDatabaseUrl, listenDatabaseUrl and readDatabaseUrl empty (put them in that Secret instead)" }}
{{- end }}
{{- else }}
{{- if not (and $s.databaseUrl $s.jwtSecret) }}
{{- fail "no credentials: set secrets.existingSecret to a Secret holding DATABASE_URL and SWITCHBOARD_JWT_SECRET, or set secrets.databaseUrl and secrets.jwtSecret" }}
{{- end }}
{{- end }}
{{- if .Values.autoscaling.enabled }}
{{- if gt (.Values.autoscaling.minReplicas | int) (.Values.autoscaling.maxReplicas | int) }}
{{- fail (printf "autoscaling.minReplicas (%d) is larger than autoscaling.maxReplicas (%d)" (.Values.autoscaling.minReplicas | int) (.Values.autoscaling.maxReplicas | int)) }}
{{- end }}
{{- if and (gt (.Values.autoscaling.targetCPUUtilizationPercentage | int) 0) (not (dig "requests" "cpu" "" .Values.resources)) }}
{{- fail "autoscaling.targetCPUUtilizationPercentage needs resources.requests.cpu (utilisation is measured against the request)" }}
{{- end }}
{{- if and (gt (.Values.autoscaling.targetMemoryUtilizationPercentage | int) 0) (not (dig "requests" "memory" "" .Values.resources)) }}
{{- fail "autoscaling.targetMemoryUtilizationPercentage needs resources.requests.memory" }}
{{- end }}
{{- $a := .Values.autoscaling }}
{{- if and (eq ($a.targetCPUUtilizationPercentage | int) 0) (eq ($a.targetMemoryUtilizationPercentage | int) 0) (eq ($a.sockets.targetAveragePerPod | int) 0) (not $a.extraMetrics) }}
{{- fail "autoscaling is enabled but has no metric: targetCPUUtilizationPercentage, targetMemoryUtilizationPercentage and sockets.targetAveragePerPod are all 0 and extraMetrics is empty" }}
{{- end }}
{{- end }}
{{- if and (ne (toString .Values.pdb.minAvailable) "") (ne (toString .Values.pdb.maxUnavailable) "") }}
{{- fail "set either pdb.minAvailable or pdb.maxUnavailable, not both (set the other to \"\")" }}
{{- end }}
{{- if and (eq (toString .Values.pdb.minAvailable) "") (eq (toString .Values.pdb.maxUnavailable) "") }}
{{- fail "set one of pdb.minAvailable or pdb.maxUnavailable" }}
{{- end }}
{{- if and (include "switchboard.pdbEnabled" .) (not (kindIs "string" .Values.pdb.minAvailable)) }}
{{- if ge (.Values.pdb.minAvailable | int) (include "switchboard.minReplicas" . | int) }}
{{- fail (printf "pdb.minAvailable (%d) must be smaller than the replica floor (%s): otherwise no pod can ever be evicted and node drains block" (.Values.pdb.minAvailable | int) (include "switchboard.minReplicas" .)) }}
{{- end }}
{{- end }}
{{- if and .Values.migrationJob.enabled (not .Values.secrets.existingSecret) }}
{{- fail "migrationJob.enabled needs secrets.existingSecret: the pre-install hook runs before the chart creates its own Secret, so the owner URL must already be in a Secret you created (key secrets.keys.migrationDatabaseUrl)" }}
{{- end }}
{{- with .Values.database.tls }}
{{- if and .enabled (not (or .caSecret .caConfigMap)) }}
{{- fail "database.tls.enabled needs database.tls.caSecret or database.tls.caConfigMap: the Secret or ConfigMap holding the CA certificate that signed PostgreSQL's server certificate" }}
{{- end }}
{{- if and .caSecret .caConfigMap }}
{{- fail "set either database.tls.caSecret or database.tls.caConfigMap, not both" }}
{{- end }}
{{- end }}
{{- range .Values.extraVolumes }}
{{- if has .name (list "tmp" "postgresql-ca") }}
{{- fail (printf "extraVolumes: the volume name %q is the chart's own (tmp: the writable /tmp; postgresql-ca: database.tls)" .name) }}
{{- end }}
{{- end }}
{{- range concat .Values.initContainers .Values.sidecars }}
{{- if eq .name "switchboard" }}
{{- fail "initContainers/sidecars: the container name \"switchboard\" is the replica's own" }}
{{- end }}
{{- end }}
{{- if and .Values.ingress.enabled (not .Values.ingress.hosts) }}
{{- fail "ingress.enabled needs at least one entry in ingress.hosts" }}
{{- end }}
{{- end }}
