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

{{- define "sie.kafkaUser" -}}
{{ .Values.kafka.sasl.username | default .Values.kafka.sasl.userSecret }}
{{- end -}}

{{- define "sie.sasl" -}}
{{ and .Values.kafka.sasl.userSecret (hasPrefix "SASL" .Values.kafka.securityProtocol) }}
{{- end -}}

{{/* The Kafka connection every component shares: SIE_* settings (sie/kernel/settings.py) */}}
{{- define "sie.kafkaEnv" -}}
- name: SIE_BOOTSTRAP_SERVERS
  value: {{ .Values.kafka.bootstrapServers | quote }}
- name: SIE_TOPIC_PREFIX
  value: {{ .Values.topicPrefix | quote }}
- name: SIE_CACHE_DIR
  value: /var/cache/sie
{{- if ne .Values.kafka.securityProtocol "PLAINTEXT" }}
- name: SIE_SECURITY_PROTOCOL
  value: {{ .Values.kafka.securityProtocol | quote }}
{{- end }}
{{- if eq (include "sie.sasl" .) "true" }}
- name: SIE_SASL_MECHANISM
  value: {{ .Values.kafka.sasl.mechanism | quote }}
- name: SIE_SASL_USERNAME
  value: {{ include "sie.kafkaUser" . | quote }}
- name: SIE_SASL_PASSWORD_FILE
  value: /etc/sie/kafka-user/{{ .Values.kafka.sasl.passwordKey }}
{{- end }}
{{- if .Values.kafka.tls.caSecret }}
- name: SIE_SSL_CA_LOCATION
  value: /etc/sie/kafka-ca/{{ .Values.kafka.tls.caKey }}
{{- end }}
{{- if .Values.kafka.replicationFactor }}
- name: SIE_REPLICATION_FACTOR
  value: {{ .Values.kafka.replicationFactor | quote }}
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "sie.kafkaMounts" -}}
- name: cache
  mountPath: /var/cache/sie
- name: tmp
  mountPath: /tmp
{{- if eq (include "sie.sasl" .) "true" }}
- name: kafka-user
  mountPath: /etc/sie/kafka-user
  readOnly: true
{{- end }}
{{- if .Values.kafka.tls.caSecret }}
- name: kafka-ca
  mountPath: /etc/sie/kafka-ca
  readOnly: true
{{- end }}
{{- end -}}

{{- define "sie.kafkaVolumes" -}}
- name: cache
  emptyDir: {}
- name: tmp
  emptyDir: {}
{{- if eq (include "sie.sasl" .) "true" }}
- name: kafka-user
  secret:
    secretName: {{ .Values.kafka.sasl.userSecret }}
    defaultMode: 0440
    items:
      - key: {{ .Values.kafka.sasl.passwordKey }}
        path: {{ .Values.kafka.sasl.passwordKey }}
{{- end }}
{{- if .Values.kafka.tls.caSecret }}
- name: kafka-ca
  secret:
    secretName: {{ .Values.kafka.tls.caSecret }}
    defaultMode: 0444
    items:
      - key: {{ .Values.kafka.tls.caKey }}
        path: {{ .Values.kafka.tls.caKey }}
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
