{{/* Object-name prefix: the release name when it already names the chart, else <release>-<chart>. */}}
{{- define "gpu-timekeeper.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "gpu-timekeeper.tag" -}}
{{- default .Chart.AppVersion .Values.image.tag -}}
{{- end -}}

{{/* <registry>/<part>:<tag> for part = timekeeper | webhook | sidecar. */}}
{{- define "gpu-timekeeper.image" -}}
{{- printf "%s/%s:%s" .root.Values.image.registry .part (include "gpu-timekeeper.tag" .root) -}}
{{- end -}}

{{- define "gpu-timekeeper.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ include "gpu-timekeeper.tag" . | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpu-timekeeper
{{- end -}}

{{/* Selector labels of one component: {root: ., component: "timekeeper"}. */}}
{{- define "gpu-timekeeper.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "gpu-timekeeper.componentLabels" -}}
{{ include "gpu-timekeeper.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Every pod of ours: non-root (uid 65532 of the images), seccomp RuntimeDefault. */}}
{{- define "gpu-timekeeper.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "gpu-timekeeper.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
{{- end -}}

{{- define "gpu-timekeeper.webhookService" -}}
{{ include "gpu-timekeeper.fullname" . }}-webhook
{{- end -}}

{{- define "gpu-timekeeper.tlsSecret" -}}
{{ include "gpu-timekeeper.fullname" . }}-webhook-tls
{{- end -}}

{{/* The Secret and key holding the database URL, whichever database the release uses. */}}
{{- define "gpu-timekeeper.databaseSecretRef" -}}
{{- if eq .Values.database.mode "external" -}}
name: {{ .Values.database.external.secretName }}
key: {{ .Values.database.external.secretKey }}
{{- else if eq .Values.database.mode "cloudnativepg" -}}
{{- /* CloudNativePG writes <cluster>-app; its `uri` is postgresql://, which the timekeeper accepts. */}}
name: {{ include "gpu-timekeeper.fullname" . }}-postgres-app
key: uri
{{- else -}}
name: {{ include "gpu-timekeeper.fullname" . }}-database
key: url
{{- end -}}
{{- end -}}

{{- define "gpu-timekeeper.pullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The self-signed bootstrap's pod, run by the install Job and the renewal CronJob alike. */}}
{{- define "gpu-timekeeper.certbootstrapPod" -}}
metadata:
  labels:
    {{- include "gpu-timekeeper.componentLabels" (dict "root" . "component" "certbootstrap") | nindent 4 }}
spec:
  restartPolicy: OnFailure
  serviceAccountName: {{ include "gpu-timekeeper.fullname" . }}-certbootstrap
  automountServiceAccountToken: true
  {{- include "gpu-timekeeper.pullSecrets" . | nindent 2 }}
  securityContext:
    {{- include "gpu-timekeeper.podSecurityContext" . | nindent 4 }}
  containers:
    - name: certbootstrap
      image: {{ include "gpu-timekeeper.image" (dict "root" . "part" "webhook") }}
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      args:
        - python
        - -m
        - webhook.certbootstrap
        - --namespace=$(POD_NAMESPACE)
        - --service={{ include "gpu-timekeeper.webhookService" . }}
        - --tls-secret={{ include "gpu-timekeeper.tlsSecret" . }}
        - --ca-secret={{ include "gpu-timekeeper.fullname" . }}-webhook-ca
        - --mutating-webhook-configuration={{ include "gpu-timekeeper.fullname" . }}
        - --validating-webhook-configuration={{ include "gpu-timekeeper.fullname" . }}
        - --restart-deployment={{ include "gpu-timekeeper.fullname" . }}-webhook
      env:
        - name: POD_NAMESPACE
          valueFrom:
            fieldRef:
              fieldPath: metadata.namespace
      resources:
        {{- toYaml .Values.certificates.resources | nindent 8 }}
      securityContext:
        {{- include "gpu-timekeeper.containerSecurityContext" . | nindent 8 }}
{{- end -}}

{{/* The objects of a file in files/ (symlinks into the kustomize base, the one source of what both render),
     as a dict from "<kind>/<name>" to the object. */}}
{{- define "gpu-timekeeper.baseObjects" -}}
{{- $objects := dict -}}
{{- range $document := splitList "\n---\n" (.root.Files.Get .file) -}}
{{- $object := fromYaml $document -}}
{{- if $object.kind -}}
{{- $_ := set $objects (printf "%s/%s" $object.kind $object.metadata.name) $object -}}
{{- end -}}
{{- end -}}
{{- toJson $objects -}}
{{- end -}}

{{/* Where exempt classes are exempt, as JSON for both servers' EXEMPT_NAMESPACES: the value, or kube-system
     and the release's namespace. */}}
{{- define "gpu-timekeeper.exemptNamespaces" -}}
{{- .Values.priorityClasses.exemptNamespaces | default (dict "*" (list "kube-system" .Release.Namespace)) | toJson -}}
{{- end -}}

{{/* TIMEKEEPER_MEMBERS (timekeeper.settings.Member by name): each member's kubeconfig where timekeeper.yaml
     mounts its Secret, and its context when given. */}}
{{- define "gpu-timekeeper.members" -}}
{{- $members := dict -}}
{{- range $name, $member := .Values.fleet.members -}}
{{- $entry := dict "kubeconfig" (printf "/etc/gpu-timekeeper/members/%s/kubeconfig" $name) -}}
{{- with $member.context }}{{ $_ := set $entry "context" . }}{{ end -}}
{{- $_ := set $members $name $entry -}}
{{- end -}}
{{- toJson $members -}}
{{- end -}}
