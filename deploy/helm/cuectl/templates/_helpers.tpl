{{/* Names: release "cuectl" of chart "cuectl" gives "cuectl", and objects cuectl-worker, ... */}}
{{- define "cuectl.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "cuectl.fullname" -}}
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

{{/* Labels of every object's metadata; "component" is passed in. */}}
{{- define "cuectl.labels" -}}
app.kubernetes.io/name: {{ include "cuectl.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
app.kubernetes.io/part-of: cuectl
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* Selector labels: never change them (a DaemonSet's selector is immutable). */}}
{{- define "cuectl.selectorLabels" -}}
app.kubernetes.io/name: {{ include "cuectl.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Pod template labels. */}}
{{- define "cuectl.podLabels" -}}
{{ include "cuectl.selectorLabels" . }}
app.kubernetes.io/part-of: cuectl
{{- end -}}

{{- define "cuectl.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}

{{- define "cuectl.imagePullPolicy" -}}
{{- with .Values.image.pullPolicy }}
imagePullPolicy: {{ . }}
{{- end -}}
{{- end -}}

{{/* The Secret and keys a pod reads its store from: CUECTL_DB and PGPASSWORD. */}}
{{- define "cuectl.dbEnv" -}}
{{- $secret := .secret | default .root.Values.database.existingSecret -}}
- name: CUECTL_DB
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ .root.Values.database.urlKey }}
- name: PGPASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ .root.Values.database.passwordKey }}
      optional: true
{{- end -}}

{{/*
A worker pool's effective settings: worker.* with the pool's own keys over them.
nodeSelector is merged key by key (a pool key set to null removes the inherited one);
gpu field by field; every other key the pool sets replaces worker's.
*/}}
{{- define "cuectl.pool" -}}
{{- $w := .root.Values.worker -}}
{{- $p := .pool -}}
{{- $out := dict -}}
{{- range $k := list "tolerations" "affinity" "resources" "runtimeClassName" "extraArgs" "extraEnv" "podAnnotations" "priorityClassName" "terminationGracePeriodSeconds" "maxUnavailable" "shmSize" -}}
{{- $_ := set $out $k (ternary (get $p $k) (get $w $k) (hasKey $p $k)) -}}
{{- end -}}
{{- $gpu := deepCopy $w.gpu -}}
{{- range $k, $v := ($p.gpu | default dict) -}}
{{- $_ := set $gpu $k $v -}}
{{- end -}}
{{- $_ := set $out "gpu" $gpu -}}
{{- $sel := dict -}}
{{- range $k, $v := $w.nodeSelector -}}
{{- $_ := set $sel $k $v -}}
{{- end -}}
{{- range $k, $v := ($p.nodeSelector | default dict) -}}
{{- if kindIs "invalid" $v -}}
{{- $_ := unset $sel $k -}}
{{- else -}}
{{- $_ := set $sel $k $v -}}
{{- end -}}
{{- end -}}
{{- $_ := set $out "nodeSelector" $sel -}}
{{- $_ := set $out "kind" ($p.kind | default "DaemonSet") -}}
{{- $_ := set $out "replicas" ($p.replicas | default 1) -}}
{{- $_ := set $out "name" $p.name -}}
{{- toYaml $out -}}
{{- end -}}

{{/* The device plugin resource a pool asks for ("" for none). */}}
{{- define "cuectl.gpuResource" -}}
{{- $g := .gpu -}}
{{- if and $g.enabled (not $g.viaRuntime) -}}
{{- if eq $g.vendor "amd" -}}
amd.com/gpu
{{- else if eq $g.migStrategy "mixed" -}}
nvidia.com/mig-{{ required (printf "worker pool %q: gpu.migStrategy mixed needs gpu.migProfile, the MIG profile the pool's pods ask for (e.g. 1g.10gb: resource nvidia.com/mig-1g.10gb)" .name) $g.migProfile }}
{{- else -}}
nvidia.com/gpu
{{- end -}}
{{- end -}}
{{- end -}}
