{{- define "sluice.labels" -}}
app.kubernetes.io/name: sluice
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{- define "sluice.selector" -}}
k8s-app: sluice
{{- end }}

{{/* sluice.flagValue renders one flag's value: a list joined with commas. */}}
{{- define "sluice.flagValue" -}}
{{- if kindIs "slice" . }}{{ join "," . }}{{ else }}{{ . }}{{ end }}
{{- end }}
