{{/* Names and labels */}}
{{- define "sie.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "sie.labels" -}}
app.kubernetes.io/name: sie
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* selector labels of one component: include "sie.selector" (list . "control") */}}
{{- define "sie.selector" -}}
app.kubernetes.io/name: sie
app.kubernetes.io/instance: {{ (index . 0).Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "sie.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "sie.apiSecret" -}}
{{ .Values.api.existingSecret | default (printf "%s-api" (include "sie.fullname" .)) }}
{{- end -}}

{{/* Where the control API's certificate comes from: secret (api.tlsSecret), certManager, generate or disabled */}}
{{- define "sie.apiTlsMode" -}}
{{- if .Values.api.tlsSecret -}}
secret
{{- else if eq .Values.api.tls.mode "auto" -}}
{{- if .Capabilities.APIVersions.Has "cert-manager.io/v1" }}certManager{{ else }}generate{{ end -}}
{{- else -}}
{{ .Values.api.tls.mode }}
{{- end -}}
{{- end -}}

{{/* The kubernetes.io/tls Secret of the control API (tls.crt, tls.key, ca.crt); empty when TLS is disabled */}}
{{- define "sie.apiTlsSecret" -}}
{{- $mode := include "sie.apiTlsMode" . -}}
{{- if eq $mode "secret" -}}
{{ .Values.api.tlsSecret }}
{{- else if ne $mode "disabled" -}}
{{ include "sie.fullname" . }}-api-tls
{{- end -}}
{{- end -}}

{{/* The control API's in-cluster names: the certificate's SANs and the operator's URL */}}
{{- define "sie.controlHost" -}}
{{ include "sie.fullname" . }}-control.{{ .Release.Namespace }}.svc
{{- end -}}

{{- define "sie.controlUrl" -}}
{{ if include "sie.apiTlsSecret" . }}https{{ else }}http{{ end }}://{{ include "sie.controlHost" . }}:{{ .Values.control.port }}
{{- end -}}

{{/*
The Kafka principal of one component: include "sie.kafkaUserSecret" (list . "control"|"agent"|"workers"|"topics").
Its own Secret (kafka.users.<component>), else the KafkaUser the chart renders for it (kafka.strimzi.users; not
for the topics Job, an administrator), else the one shared kafka.sasl.userSecret. docs/security.md, "On Kubernetes".
*/}}
{{- define "sie.kafkaUserSecret" -}}
{{- $ := index . 0 -}}{{- $c := index . 1 -}}
{{- $own := index $.Values.kafka.users $c -}}
{{- if $own -}}
{{ $own }}
{{- else if and $.Values.kafka.strimzi.users (ne $c "topics") -}}
{{ include "sie.fullname" $ }}-{{ $c }}
{{- else -}}
{{ $.Values.kafka.sasl.userSecret }}
{{- end -}}
{{- end -}}

{{/* The SASL user name of a component: Strimzi names a KafkaUser's Secret after the user */}}
{{- define "sie.kafkaUser" -}}
{{- $ := index . 0 -}}{{- $secret := include "sie.kafkaUserSecret" . -}}
{{- if eq $secret $.Values.kafka.sasl.userSecret -}}
{{ $.Values.kafka.sasl.username | default $secret }}
{{- else -}}
{{ $secret }}
{{- end -}}
{{- end -}}

{{- define "sie.sasl" -}}
{{- $ := index . 0 -}}
{{ and (include "sie.kafkaUserSecret" .) (hasPrefix "SASL" $.Values.kafka.securityProtocol) }}
{{- end -}}

{{/* The agent hands its workers a principal of their own (role scorer) when theirs differs from the agent's */}}
{{- define "sie.workersOwnUser" -}}
{{- $ := index . 0 -}}
{{ and (eq (include "sie.sasl" (list $ "agent")) "true") (ne (include "sie.kafkaUserSecret" (list $ "workers")) (include "sie.kafkaUserSecret" (list $ "agent"))) }}
{{- end -}}

{{/* The Kafka connection of one component: include "sie.kafkaEnv" (list . "control"); SIE_* settings (sie/kernel/settings.py) */}}
{{- define "sie.kafkaEnv" -}}
{{- $ := index . 0 -}}{{- $c := index . 1 -}}
- name: SIE_BOOTSTRAP_SERVERS
  value: {{ $.Values.kafka.bootstrapServers | quote }}
- name: SIE_TOPIC_PREFIX
  value: {{ $.Values.topicPrefix | quote }}
- name: SIE_CACHE_DIR
  value: /var/cache/sie
{{- if ne $.Values.kafka.securityProtocol "PLAINTEXT" }}
- name: SIE_SECURITY_PROTOCOL
  value: {{ $.Values.kafka.securityProtocol | quote }}
{{- end }}
{{- if eq (include "sie.sasl" .) "true" }}
- name: SIE_SASL_MECHANISM
  value: {{ $.Values.kafka.sasl.mechanism | quote }}
- name: SIE_SASL_USERNAME
  value: {{ include "sie.kafkaUser" . | quote }}
- name: SIE_SASL_PASSWORD_FILE
  value: /etc/sie/kafka-user/{{ $.Values.kafka.sasl.passwordKey }}
{{- end }}
{{- if and (eq $c "agent") (eq (include "sie.workersOwnUser" .) "true") }}
- name: SIE_WORKER_SASL_USERNAME
  value: {{ include "sie.kafkaUser" (list $ "workers") | quote }}
- name: SIE_WORKER_SASL_PASSWORD_FILE
  value: /etc/sie/kafka-workers/{{ $.Values.kafka.sasl.passwordKey }}
{{- end }}
{{- if $.Values.kafka.tls.caSecret }}
- name: SIE_SSL_CA_LOCATION
  value: /etc/sie/kafka-ca/{{ $.Values.kafka.tls.caKey }}
{{- end }}
{{- if $.Values.kafka.replicationFactor }}
- name: SIE_REPLICATION_FACTOR
  value: {{ $.Values.kafka.replicationFactor | quote }}
{{- end }}
{{- with $.Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "sie.kafkaMounts" -}}
{{- $ := index . 0 -}}{{- $c := index . 1 -}}
- name: cache
  mountPath: /var/cache/sie
- name: tmp
  mountPath: /tmp
{{- if eq (include "sie.sasl" .) "true" }}
- name: kafka-user
  mountPath: /etc/sie/kafka-user
  readOnly: true
{{- end }}
{{- if and (eq $c "agent") (eq (include "sie.workersOwnUser" .) "true") }}
- name: kafka-workers
  mountPath: /etc/sie/kafka-workers
  readOnly: true
{{- end }}
{{- if $.Values.kafka.tls.caSecret }}
- name: kafka-ca
  mountPath: /etc/sie/kafka-ca
  readOnly: true
{{- end }}
{{- end -}}

{{- define "sie.kafkaVolumes" -}}
{{- $ := index . 0 -}}{{- $c := index . 1 -}}
{{- /* an agent whose workers run as agent.workerUid (root, owning its secrets) reads them 0400; else its group does */ -}}
{{- $mode := ternary "0400" "0440" (and (eq $c "agent") (not (empty $.Values.agent.workerUid))) -}}
- name: cache
  emptyDir: {}
- name: tmp
  emptyDir: {}
{{- if eq (include "sie.sasl" .) "true" }}
- name: kafka-user
  secret:
    secretName: {{ include "sie.kafkaUserSecret" . }}
    defaultMode: {{ $mode }}
    items:
      - key: {{ $.Values.kafka.sasl.passwordKey }}
        path: {{ $.Values.kafka.sasl.passwordKey }}
{{- end }}
{{- if and (eq $c "agent") (eq (include "sie.workersOwnUser" .) "true") }}
- name: kafka-workers
  secret:
    secretName: {{ include "sie.kafkaUserSecret" (list $ "workers") }}
    defaultMode: {{ $mode }}
    items:
      - key: {{ $.Values.kafka.sasl.passwordKey }}
        path: {{ $.Values.kafka.sasl.passwordKey }}
{{- end }}
{{- if $.Values.kafka.tls.caSecret }}
- name: kafka-ca
  secret:
    secretName: {{ $.Values.kafka.tls.caSecret }}
    defaultMode: 0444
    items:
      - key: {{ $.Values.kafka.tls.caKey }}
        path: {{ $.Values.kafka.tls.caKey }}
{{- end }}
{{- end -}}

{{- define "sie.podSecurity" -}}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "sie.scrapeAnnotations" -}}
{{- $ := index . 0 -}}
{{- if $.Values.metrics.annotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ index . 1 | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- end -}}
